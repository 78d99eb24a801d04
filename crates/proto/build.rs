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
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
