//! The admin listener of every long-running role (sidecar, aggregator, controller):
//! `/healthz`, `/readyz`, `/metrics` (Prometheus text) and, on a controller, `/v1/hosts` (which
//! host runs which rules version), `/v1/buckets` (limit, offered load and drop ratio of each
//! bucket) and a live dashboard on `/`. Each role says what it shows through an [`AdminView`].
//!
//! How the port is protected is an [`AdminAuth`] ("Admin ports"):
//! - with a certificate ([`AdminAuth::tls`]) the port speaks server TLS (no client certificate),
//!   and each connection's handshake runs in its own task, so a stalled or failed one never
//!   holds up the others; certificate files re-read on change apply from the next connection;
//! - with a token ([`AdminAuth::token`], from `--admin-token-file`) `/healthz`, `/readyz` and
//!   `/metrics` stay open while everything else needs `Authorization: Bearer TOKEN` or the
//!   sign-in cookie a browser gets from `POST /signin` ([`auth`] says how the cookie is made);
//! - with neither, everything is open, which [`check_exposure`] allows on loopback only.

mod auth;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use spillway_tls::server::{Acceptor, ClientAuth};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::Stop;

use crate::{BindError, accept_or_stop};

pub use auth::{AdminAuth, AdminToken, AdminTokenError, check_exposure};

use auth::Gate;

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
    /// The dashboard's script, served on `/dashboard.js`: the content security policy
    /// ([`SECURITY_HEADERS`]) runs no inline script.
    fn dashboard_script(&self) -> Option<&'static str> {
        None
    }
}

/// What every admin page and API answer carries, on the admin listeners and the rules service
/// alike: a content security policy that runs only the listener's own scripts (none inline),
/// loads nothing from elsewhere and lets no page frame it; the same refusal to be framed for
/// older browsers; no guessing of content types; no `Referer` sent from its pages. Styles may
/// be inline: the dashboard sizes its bars with `style` attributes.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
];

/// Adds [`SECURITY_HEADERS`] to an answer's headers.
pub fn add_security_headers(headers: &mut http::HeaderMap) {
    for (name, value) in SECURITY_HEADERS {
        headers.insert(
            http::header::HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
}

/// Serves the admin endpoints on `addr` when one is given, protected by `auth`, adding the task
/// to `tasks`; returns the bound address (the real port when `addr` asked for port 0).
pub async fn start_if(
    addr: Option<SocketAddr>,
    auth: AdminAuth,
    view: Arc<dyn AdminView>,
    stop: Stop,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<Option<SocketAddr>, BindError> {
    let Some(addr) = addr else { return Ok(None) };
    let (listener, local) = crate::bind(addr).await?;
    tasks.push(tokio::spawn(serve(listener, view, stop, auth)));
    Ok(Some(local))
}

/// Serves the admin endpoints of `view` on `listener` (HTTP/1.1, over TLS when `auth` has a
/// certificate) until `stop` fires.
pub async fn serve(
    listener: TcpListener,
    view: Arc<dyn AdminView>,
    mut stop: Stop,
    auth: AdminAuth,
) {
    let gate = Gate::new(&auth).map(Arc::new);
    let acceptor = auth
        .tls
        .map(|source| Acceptor::new(source, ClientAuth::None, &[b"http/1.1"]));
    while let Some((stream, remote)) = accept_or_stop(&listener, &mut stop).await {
        let view = view.clone();
        let gate = gate.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            match acceptor {
                None => connection(TokioIo::new(stream), view, gate).await,
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok((tls, _)) => connection(TokioIo::new(tls), view, gate).await,
                    Err(err) => tracing::debug!(%remote, "admin port: TLS handshake failed: {err}"),
                },
            }
        });
    }
}

/// Serves the requests of one connection.
async fn connection<I>(io: I, view: Arc<dyn AdminView>, gate: Option<Arc<Gate>>)
where
    I: Read + Write + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let view = view.clone();
        let gate = gate.clone();
        async move {
            let mut response = handle(view.as_ref(), gate.as_deref(), request).await;
            add_security_headers(response.headers_mut());
            Ok::<_, Infallible>(response)
        }
    });
    // A client that goes away mid-request is its own business, not the listener's.
    let _ = http1::Builder::new().serve_connection(io, service).await;
}

/// Paths that stay open whatever the token: probes and scrapers carry none.
const OPEN: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

async fn handle(
    view: &dyn AdminView,
    gate: Option<&Gate>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let Some(gate) = gate else {
        return route(view, &request);
    };
    let path = request.uri().path();
    let reads = request.method() == Method::GET || request.method() == Method::HEAD;
    match (request.method(), path) {
        (&Method::POST, "/signin") => return gate.sign_in(request.into_body()).await,
        (&Method::POST, "/signout") => return gate.sign_out(request.headers()),
        (_, "/signin") if reads => return gate.sign_in_page(StatusCode::OK, None),
        _ => {}
    }
    if reads && !OPEN.contains(&path) && !gate.admits(request.headers()) {
        return gate.refuse(path == "/" && view.dashboard().is_some());
    }
    route(view, &request)
}

/// A response with `body` of `content_type`.
fn answer(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn route(view: &dyn AdminView, request: &Request<Incoming>) -> Response<Full<Bytes>> {
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
        "/dashboard.js" if let Some(script) = view.dashboard_script() => answer(
            StatusCode::OK,
            script.to_owned(),
            "text/javascript; charset=utf-8",
        ),
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
