//! The admin listener of every long-running role (sidecar, aggregator, controller):
//! `/healthz`, `/readyz`, `/metrics` (Prometheus text) and, on a controller, `/v1/hosts` (which
//! host runs which rules version), `/v1/buckets` (limit, offered load and drop ratio of each
//! bucket) and a live dashboard on `/`. Each role says what it shows through an [`AdminView`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use spillway_link::Stop;

use crate::{BindError, accept_or_stop};

/// What a component shows on its admin listener.
pub trait AdminView: Send + Sync + 'static {
    /// `Ok(detail)` when ready to serve, `Err(why not)` otherwise.
    fn ready(&self) -> Result<String, String>;
    /// The Prometheus text exposition.
    fn metrics(&self) -> String;
    /// A JSON document for another path, if the component serves one there.
    fn json(&self, _path: &str) -> Option<String> {
        None
    }
    /// The paths [`AdminView::json`] serves, named in the answer to an unknown path.
    fn json_paths(&self) -> &'static [&'static str] {
        &[]
    }
    /// An HTML page of live state, served on `/`, if the component has one.
    fn dashboard(&self) -> Option<&'static str> {
        None
    }
}

/// Serves the admin endpoints on `addr` when one is given, adding the task to `tasks`; returns
/// the bound address (the real port when `addr` asked for port 0).
pub async fn start_if(
    addr: Option<SocketAddr>,
    view: Arc<dyn AdminView>,
    stop: Stop,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<SocketAddr>, BindError> {
    let Some(addr) = addr else { return Ok(None) };
    let (local, task) = start(addr, view, stop).await?;
    tasks.push(task);
    Ok(Some(local))
}

/// Binds `addr` and serves until `stop` fires.
async fn start(
    addr: SocketAddr,
    view: Arc<dyn AdminView>,
    stop: Stop,
) -> Result<(SocketAddr, JoinHandle<()>), BindError> {
    let (listener, local) = crate::bind(addr).await?;
    Ok((local, tokio::spawn(serve(listener, view, stop))))
}

/// Serves the admin endpoints of `view` on `listener` (HTTP/1.1) until `stop` fires.
pub async fn serve(listener: TcpListener, view: Arc<dyn AdminView>, mut stop: Stop) {
    while let Some((stream, _)) = accept_or_stop(&listener, &mut stop).await {
        let view = view.clone();
        let service = service_fn(move |request| {
            let view = view.clone();
            async move { Ok::<_, Infallible>(route(view.as_ref(), &request)) }
        });
        tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
    }
}

fn route(view: &dyn AdminView, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, body: String, content_type: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return answer(
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET\n".into(),
            "text/plain",
        );
    }
    let dashboard = view.dashboard();
    match request.uri().path() {
        "/" if let Some(page) = dashboard => {
            answer(StatusCode::OK, page.to_owned(), "text/html; charset=utf-8")
        }
        "/healthz" => answer(StatusCode::OK, "ok\n".into(), "text/plain"),
        "/readyz" => match view.ready() {
            Ok(detail) => answer(StatusCode::OK, format!("ready: {detail}\n"), "text/plain"),
            Err(why) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
                "text/plain",
            ),
        },
        "/metrics" => answer(
            StatusCode::OK,
            view.metrics(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        path => match view.json(path) {
            Some(body) => answer(StatusCode::OK, body, "application/json"),
            None => {
                let mut paths = vec!["/healthz", "/readyz", "/metrics"];
                paths.extend_from_slice(view.json_paths());
                if dashboard.is_some() {
                    paths.push("/ (the dashboard)");
                }
                answer(
                    StatusCode::NOT_FOUND,
                    format!("not found; try {}\n", paths.join(", ")),
                    "text/plain",
                )
            }
        },
    }
}
