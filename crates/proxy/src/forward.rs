//! Forwarding to the upstream: two pooled clients (HTTP/1.1, and HTTP/2 prior knowledge for
//! requests that arrived over HTTP/2, so gRPC keeps its streams and trailers), and the removal
//! of hop-by-hop headers, which belong to one connection and must not travel further.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::error::ProxyError;

/// Where admitted requests go.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    authority: Authority,
    h1: Client<HttpConnector, Incoming>,
    h2: Client<HttpConnector, Incoming>,
}

/// Headers that describe one hop (RFC 9110 §7.6.1), plus `te`, handled apart.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in `connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    // `te: trailers` is how gRPC says it reads trailers; any other `te` is hop-by-hop.
    let keep_te = headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if !keep_te {
        headers.remove(header::TE);
    }
}

impl Upstream {
    /// Parses `http://HOST:PORT` and builds the pools.
    pub(crate) fn new(url: &str) -> Result<Self, ProxyError> {
        let fail = |problem: &str| ProxyError::Upstream {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| fail("not a URL"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(fail("the scheme must be http"));
        }
        let authority = uri.authority().cloned().ok_or_else(|| fail("no host"))?;
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(fail(
                "a path is not supported; requests keep their own paths",
            ));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let h1 = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector.clone());
        let h2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self { authority, h1, h2 })
    }

    /// Sends `request` to the upstream, keeping its method, path, query, headers (but the
    /// hop-by-hop ones) and body, and returns the upstream's response likewise cleaned.
    pub(crate) async fn forward(
        &self,
        mut request: Request<Incoming>,
    ) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path);
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        strip_hop_by_hop(request.headers_mut());
        let client = if request.version() == Version::HTTP_2 {
            &self.h2
        } else {
            *request.version_mut() = Version::HTTP_11;
            &self.h1
        };
        let mut response = client.request(request).await?;
        strip_hop_by_hop(response.headers_mut());
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_and_te_trailers_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "keep-alive, x-secret".parse().unwrap());
        headers.insert("x-secret", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert("te", "trailers".parse().unwrap());
        headers.insert("x-user-id", "alice".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "x-user-id"]);
        headers.insert("te", "gzip".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert!(headers.get("te").is_none());
    }

    #[test]
    fn upstream_urls_are_checked() {
        assert!(Upstream::new("http://127.0.0.1:8080").is_ok());
        assert!(Upstream::new("https://127.0.0.1:8080").is_err());
        assert!(Upstream::new("http://127.0.0.1:8080/api").is_err());
        assert!(Upstream::new("127.0.0.1:8080").is_err());
    }
}
