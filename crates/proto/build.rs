//! Generates `spillway.v1` at build time with the vendored `protoc`, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // No generated `connect` helpers: they need tonic's transport, which the embeddable client
    // would then pull in with its server half; dialing goes through `spillway-link`'s endpoints.
    tonic_prost_build::configure()
        .build_transport(false)
        // Prost's codec with smaller first buffers: see `spillway_proto::codec`.
        .codec_path("crate::codec::LeanCodec")
        .compile_with_config(config, &["proto/spillway/v1/control.proto"], &["proto"])?;
    // The aggregator's side of `spillway.v1.Aggregator/Link`, the same call on the wire, whose
    // instructions go out as bytes encoded once per interval for every host that gets the
    // zone's own (`spillway_proto::codec::Encoded`), rather than as a message copied and encoded
    // per host. Its file is `spillway.v1.Aggregator.rs`, beside the generated `spillway.v1.rs`.
    let link = tonic_build::manual::Method::builder()
        .name("link")
        .route_name("Link")
        .input_type("crate::v1::Report")
        .output_type("crate::codec::Encoded")
        .codec_path("crate::codec::EncodedCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let aggregator = tonic_build::manual::Service::builder()
        .name("Aggregator")
        .package("spillway.v1")
        .method(link)
        .build();
    tonic_build::manual::Builder::new()
        .build_client(false)
        .build_transport(false)
        .compile(&[aggregator]);
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
