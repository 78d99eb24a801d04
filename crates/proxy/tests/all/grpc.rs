//! gRPC through the proxy with a real tonic client over h2c: unary and server-streaming calls
//! pass with their trailers, and a dropped call is `RESOURCE_EXHAUSTED` to the client.

use crate::support::{Upstream, config, proxy};
use http::uri::PathAndQuery;
use tonic::Code;
use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

/// The message of the test service (`echo.Echo`), written by hand instead of generated.
#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    text: String,
}

async fn client(addr: std::net::SocketAddr) -> Grpc<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("h2c connection to the proxy");
    Grpc::new(channel)
}

async fn unary(grpc: &mut Grpc<Channel>, method: &'static str) -> Result<Echo, tonic::Status> {
    grpc.ready().await.unwrap();
    let request = tonic::Request::new(Echo {
        text: "hello".into(),
    });
    grpc.unary(
        request,
        PathAndQuery::from_static(method),
        ProstCodec::<Echo, Echo>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_and_streaming_calls_pass_and_a_drop_is_resource_exhausted() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&[
            "{ name: limited, match: { procedure: /echo.Echo/Limited }, limit: 1/h, algorithm: token-bucket }",
        ]),
        &upstream.url(),
    )
    .await;
    let mut grpc = client(running.proxy.addr()).await;

    let answer = unary(&mut grpc, "/echo.Echo/Say")
        .await
        .expect("unary call");
    assert_eq!(answer.text, "hello");

    grpc.ready().await.unwrap();
    let response = grpc
        .server_streaming(
            tonic::Request::new(Echo {
                text: "again".into(),
            }),
            PathAndQuery::from_static("/echo.Echo/Stream"),
            ProstCodec::<Echo, Echo>::default(),
        )
        .await
        .expect("server-streaming call");
    let mut stream = response.into_inner();
    let mut texts = Vec::new();
    while let Some(message) = stream.message().await.expect("a message or the end") {
        texts.push(message.text);
    }
    assert_eq!(texts, ["again", "again", "again"]);
    let trailers = stream.trailers().await.unwrap().expect("trailers");
    assert_eq!(
        trailers
            .get("x-upstream-trailer")
            .unwrap()
            .to_str()
            .unwrap(),
        "intact"
    );

    // The bucket admits one call an hour: the second is refused by the proxy, not the upstream.
    assert_eq!(
        unary(&mut grpc, "/echo.Echo/Limited").await.unwrap().text,
        "hello"
    );
    let seen = upstream.seen();
    let status = unary(&mut grpc, "/echo.Echo/Limited").await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("bucket limited"), "{status:?}");
    assert_eq!(upstream.seen(), seen);
    running.proxy.shutdown().await;
}
