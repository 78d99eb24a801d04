//! The admin port's token, browser sign-in and TLS, over real sockets on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use spillway_net::admin::{self, AdminAuth, AdminToken, AdminView, check_exposure};
use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::{TlsFiles, TlsSource};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const TOKEN: &str = "s3cret-admin-token-0123456789";

struct View;

impl AdminView for View {
    fn ready(&self) -> Result<String, String> {
        Ok("fine".into())
    }
    fn metrics(&self) -> String {
        "spillway_up 1\n".into()
    }
    fn json(&self, path: &str) -> Option<String> {
        (path == "/v1/x").then(|| "{\"x\":1}".into())
    }
    fn json_paths(&self) -> &'static [&'static str] {
        &["/v1/x"]
    }
    fn dashboard(&self) -> Option<&'static str> {
        Some("<html>the dashboard</html>")
    }
}

/// An answer as the minimal client below read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.1 request with `Connection: close` and reads the answer to the end.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify; what arrived before is the answer.
    let _ = stream.read_to_end(&mut raw).await;
    parse(&raw).unwrap_or_else(|| panic!("not an HTTP answer: {:?}", String::from_utf8_lossy(&raw)))
}

fn parse(raw: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    exchange(
        TcpStream::connect(addr).await.unwrap(),
        "GET",
        path,
        headers,
        "",
    )
    .await
}

async fn post_form(addr: SocketAddr, path: &str, body: &str) -> Answer {
    let headers = [("Content-Type", "application/x-www-form-urlencoded")];
    exchange(
        TcpStream::connect(addr).await.unwrap(),
        "POST",
        path,
        &headers,
        body,
    )
    .await
}

/// Serves [`View`] on a loopback port with `auth` until the returned sender is dropped.
async fn serve(auth: AdminAuth) -> (SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(admin::serve(listener, Arc::new(View), stop_rx, auth));
    (addr, stop)
}

fn token(dir: &Path) -> AdminToken {
    let path = dir.join("admin-token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    AdminToken::from_file(&path).unwrap()
}

/// The `name=value` part of a `Set-Cookie` header.
fn cookie_pair(set_cookie: &str) -> &str {
    set_cookie.split(';').next().unwrap().trim()
}

#[tokio::test]
async fn with_a_token_only_probes_and_metrics_are_open() {
    let dir = tempfile::tempdir().unwrap();
    let auth = AdminAuth {
        tls: None,
        token: Some(token(dir.path())),
    };
    let (addr, _stop) = serve(auth).await;

    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(addr, open, &[]).await.status, 200, "{open}");
    }
    let refused = get(addr, "/v1/x", &[]).await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.header("www-authenticate"),
        Some("Bearer realm=\"spillway-admin\"")
    );
    assert!(
        refused.body.contains("Authorization: Bearer"),
        "{}",
        refused.body
    );
    // An unknown path says nothing about what exists until the caller authenticates.
    assert_eq!(get(addr, "/v1/nothing", &[]).await.status, 401);

    let bearer = format!("Bearer {TOKEN}");
    let admitted = get(addr, "/v1/x", &[("Authorization", &bearer)]).await;
    assert_eq!(admitted.status, 200);
    assert_eq!(admitted.body, "{\"x\":1}");
    let lower = format!("bearer {TOKEN}");
    assert_eq!(
        get(addr, "/v1/x", &[("Authorization", &lower)])
            .await
            .status,
        200
    );

    let wrong = format!("Bearer {TOKEN}x");
    assert_eq!(
        get(addr, "/v1/x", &[("Authorization", &wrong)])
            .await
            .status,
        401
    );
    assert_eq!(
        get(addr, "/v1/x", &[("Authorization", "Bearer short")])
            .await
            .status,
        401
    );
    // The token is not a cookie value.
    let as_cookie = format!("spillway_admin={TOKEN}");
    assert_eq!(
        get(addr, "/v1/x", &[("Cookie", &as_cookie)]).await.status,
        401
    );

    // Other methods stay refused.
    let put = exchange(
        TcpStream::connect(addr).await.unwrap(),
        "PUT",
        "/v1/x",
        &[],
        "",
    )
    .await;
    assert_eq!(put.status, 405);
}

#[tokio::test]
async fn a_browser_signs_in_once_and_its_cookie_opens_the_dashboard_and_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let auth = AdminAuth {
        tls: None,
        token: Some(token(dir.path())),
    };
    let (addr, _stop) = serve(auth).await;

    let page = get(addr, "/", &[]).await;
    assert_eq!(page.status, 401);
    assert!(page.body.contains("type=\"password\""), "{}", page.body);
    assert!(page.body.contains("action=\"/signin\""), "{}", page.body);
    assert!(!page.body.contains("the dashboard"));

    let wrong = post_form(addr, "/signin", "token=not-the-token-at-all").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert!(wrong.body.contains("not the token"), "{}", wrong.body);
    assert!(wrong.body.contains("type=\"password\""));

    // The form encodes the token; `-` stays, so encode a byte by hand to test the decoding.
    let encoded = TOKEN.replacen('-', "%2D", 1);
    let signed_in = post_form(addr, "/signin", &format!("token={encoded}")).await;
    assert_eq!(signed_in.status, 303);
    assert_eq!(signed_in.header("location"), Some("/"));
    let set_cookie = signed_in.header("set-cookie").unwrap().to_owned();
    assert!(set_cookie.starts_with("spillway_admin="), "{set_cookie}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(
        !set_cookie.contains("Secure"),
        "no Secure without TLS: {set_cookie}"
    );
    assert!(!set_cookie.contains(TOKEN), "the cookie is not the token");

    let cookie = format!("other=1; {}", cookie_pair(&set_cookie));
    let dashboard = get(addr, "/", &[("Cookie", &cookie)]).await;
    assert_eq!(dashboard.status, 200);
    assert_eq!(dashboard.body, "<html>the dashboard</html>");
    assert_eq!(get(addr, "/v1/x", &[("Cookie", &cookie)]).await.status, 200);

    // A second browser signs in with a session of its own.
    let second = post_form(addr, "/signin", &format!("token={TOKEN}")).await;
    let second = cookie_pair(second.header("set-cookie").unwrap()).to_owned();
    assert_ne!(
        second,
        cookie_pair(&set_cookie),
        "each sign-in its own session"
    );
    assert_eq!(get(addr, "/", &[("Cookie", &second)]).await.status, 200);

    let signed_out = exchange(
        TcpStream::connect(addr).await.unwrap(),
        "POST",
        "/signout",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Cookie", &cookie),
        ],
        "",
    )
    .await;
    assert_eq!(signed_out.status, 303);
    assert!(
        signed_out
            .header("set-cookie")
            .unwrap()
            .contains("Max-Age=0")
    );
    // The session is over: a copy of its cookie opens nothing, and the other browser's still does.
    assert_eq!(get(addr, "/", &[("Cookie", &cookie)]).await.status, 401);
    assert_eq!(get(addr, "/v1/x", &[("Cookie", &cookie)]).await.status, 401);
    assert_eq!(get(addr, "/", &[("Cookie", &second)]).await.status, 200);

    // A form past the bound is refused.
    let huge = format!("token={}", "a".repeat(10_000));
    assert_eq!(post_form(addr, "/signin", &huge).await.status, 413);
}

#[tokio::test]
async fn without_a_token_everything_is_open_as_before() {
    let (addr, _stop) = serve(AdminAuth::default()).await;
    assert_eq!(get(addr, "/", &[]).await.body, "<html>the dashboard</html>");
    assert_eq!(get(addr, "/v1/x", &[]).await.status, 200);
    assert_eq!(post_form(addr, "/signin", "token=x").await.status, 405);
    let unknown = get(addr, "/nope", &[]).await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.body.contains("/v1/x"), "{}", unknown.body);
}

#[test]
fn a_port_off_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let open = AdminAuth::default();
    let guarded = AdminAuth {
        tls: None,
        token: Some(token(dir.path())),
    };
    for exposed in ["0.0.0.0:9000", "[::]:9000", "10.0.0.5:9000"] {
        let addr: SocketAddr = exposed.parse().unwrap();
        let err = check_exposure(addr, &open).unwrap_err();
        assert!(err.contains("--admin-token-file FILE"), "{err}");
        check_exposure(addr, &guarded).unwrap();
    }
    for loopback in ["127.0.0.1:9000", "[::1]:9000", "[::ffff:127.0.0.1]:9000"] {
        check_exposure(loopback.parse().unwrap(), &open).unwrap();
    }
}

#[test]
fn a_token_file_must_hold_a_token_of_sixteen_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n \n").unwrap();
    let err = AdminToken::from_file(&empty).unwrap_err().to_string();
    assert!(err.contains(&empty.display().to_string()), "{err}");
    assert!(err.contains("empty"), "{err}");

    let short = dir.path().join("short-token");
    std::fs::write(&short, "abc\n").unwrap();
    let err = AdminToken::from_file(&short).unwrap_err().to_string();
    assert!(err.contains("short-token") && err.contains("16"), "{err}");

    let missing = dir.path().join("missing");
    let err = AdminToken::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");

    assert_eq!(format!("{:?}", token(dir.path())), "AdminToken(***)");
}

/// A development CA in `dir/ca` and a server leaf for localhost in `dir/admin`.
fn pki(dir: &Path) -> (Arc<TlsSource>, rustls::RootCertStore) {
    let ca = dir.join("ca");
    certs::init(&ca, "spillway.local", false).unwrap();
    let leaf = Leaf {
        role: LeafRole::Server,
        region: None,
        zone: None,
        host: None,
        names: vec![],
        days: 1,
    };
    let out = dir.join("admin");
    certs::issue(&ca, "spillway.local", &leaf, &out, false).unwrap();
    let source = TlsSource::load(
        TlsFiles {
            cert: out.join("cert.pem"),
            key: out.join("key.pem"),
            ca: None,
        },
        "spillway.local",
    )
    .unwrap();
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    (source, roots)
}

async fn https(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
    method: &str,
    path: &str,
    body: &str,
) -> Answer {
    let config = rustls::ClientConfig::builder_with_provider(spillway_tls::files::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    let headers = [("Content-Type", "application/x-www-form-urlencoded")];
    exchange(tls, method, path, &headers, body).await
}

#[tokio::test]
async fn with_a_certificate_the_port_speaks_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    let (source, roots) = pki(dir.path());
    let auth = AdminAuth {
        tls: Some(source),
        token: Some(token(dir.path())),
    };
    let (addr, _stop) = serve(auth).await;

    // A client that connects and says nothing holds up no one else's handshake.
    let _stalled = TcpStream::connect(addr).await.unwrap();

    let health = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        https(addr, &roots, "GET", "/healthz", ""),
    )
    .await
    .expect("a stalled handshake does not block the next one");
    assert_eq!(health.status, 200);
    assert_eq!(health.body, "ok\n");
    assert_eq!(https(addr, &roots, "GET", "/v1/x", "").await.status, 401);

    let signed_in = https(addr, &roots, "POST", "/signin", &format!("token={TOKEN}")).await;
    assert_eq!(signed_in.status, 303);
    let set_cookie = signed_in.header("set-cookie").unwrap();
    assert!(set_cookie.contains("; Secure"), "{set_cookie}");
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");

    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = plain.read_to_end(&mut raw).await;
    assert!(
        !raw.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&raw)
    );
}
