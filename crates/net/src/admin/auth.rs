//! Who may read an admin port: its TLS certificate, its token, the browser sign-in, and the rule
//! that a port off loopback must have a token.
//!
//! A browser signs in once by posting the token to `/signin`. The cookie it gets is not the
//! token: each sign-in draws a random 32-byte session id, kept by the listener (at most
//! [`MAX_SESSIONS`], the oldest forgotten first), and the cookie holds it (hex). A cookie
//! therefore never reveals the token, stops working when the process restarts, and is checked
//! like the token, in constant time. `POST /signout` ends the session it carries, so a copy of
//! the cookie taken before stops working too.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CACHE_CONTROL, COOKIE, HeaderValue, LOCATION, SET_COOKIE, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use spillway_tls::TlsSource;
use subtle::ConstantTimeEq;

use super::answer;

/// The cookie a browser gets from `POST /signin`.
pub const SESSION_COOKIE: &str = "spillway_admin";

/// The largest sign-in form accepted; a token is well under it.
const MAX_FORM_BYTES: usize = 4096;

/// The shortest token accepted: 16 bytes, 128 bits if they are random.
const MIN_TOKEN_BYTES: usize = 16;

const REALM: &str = "Bearer realm=\"spillway-admin\"";

/// How an admin listener is protected. The default, no TLS and no token, leaves every path open
/// and is fit for a loopback address only ([`check_exposure`]).
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    /// Serve TLS with these certificate files (`--tls-cert/--tls-key`); clients present none.
    pub tls: Option<Arc<TlsSource>>,
    /// Require this token for `/v1/*` and the dashboard (`--admin-token-file`).
    pub token: Option<AdminToken>,
}

/// The bearer token of an admin port. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<[u8]>);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

/// Why a token file cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum AdminTokenError {
    #[error("{}: cannot read the admin token: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the admin token file is empty", .path.display())]
    Empty { path: PathBuf },
    #[error(
        "{}: the admin token is {len} bytes; it needs at least {MIN_TOKEN_BYTES} \
         (make one with `openssl rand -hex 32`)",
        .path.display()
    )]
    TooShort { path: PathBuf, len: usize },
}

impl AdminToken {
    /// Reads the token from `path`, without the trailing whitespace and newline an editor or
    /// `echo` leaves; refuses an empty file or a token under 16 bytes.
    pub fn from_file(path: &Path) -> Result<Self, AdminTokenError> {
        let bytes = std::fs::read(path).map_err(|source| AdminTokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let token = trim_end(&bytes);
        match token.len() {
            0 => Err(AdminTokenError::Empty {
                path: path.to_owned(),
            }),
            len if len < MIN_TOKEN_BYTES => Err(AdminTokenError::TooShort {
                path: path.to_owned(),
                len,
            }),
            _ => Ok(Self(token.into())),
        }
    }

    /// Whether `candidate` is the token, in time that does not depend on where they differ.
    fn matches(&self, candidate: &[u8]) -> bool {
        constant_time_eq(&self.0, candidate)
    }
}

/// Refuses an admin address that is not loopback when no token protects it (such a port
/// exits 2). `0.0.0.0` and `::` are every interface, not loopback.
pub fn check_exposure(addr: SocketAddr, auth: &AdminAuth) -> Result<(), String> {
    if addr.ip().to_canonical().is_loopback() || auth.token.is_some() {
        return Ok(());
    }
    Err(format!(
        "the admin port {addr} is not a loopback address, so its /v1/* and dashboard would be \
         open to the network: give --admin-token-file FILE (a token of at least \
         {MIN_TOKEN_BYTES} bytes), or listen on 127.0.0.1"
    ))
}

/// Browser sessions one listener keeps at once; a sign-in beyond them ends the oldest.
pub const MAX_SESSIONS: usize = 256;

/// The token checks of one listener, with the sessions its cookies carry.
pub(super) struct Gate {
    token: AdminToken,
    /// The ids of the signed-in browsers, oldest first.
    sessions: std::sync::Mutex<std::collections::VecDeque<String>>,
    /// Whether the listener speaks TLS, so cookies are marked `Secure`.
    secure: bool,
}

/// A new session id: 32 random bytes as hex; `None` when the system's random source failed
/// (the bearer still works then, sign-in does not).
fn new_session() -> Option<String> {
    let mut secret = [0u8; 32];
    match getrandom::fill(&mut secret) {
        Ok(()) => Some(hex(&secret)),
        Err(err) => {
            tracing::error!("admin port: no random session id, browser sign-in refused: {err}");
            None
        }
    }
}

/// The values of the session cookie a request carries.
fn session_cookies(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .filter_map(|pair| {
            trim(pair)
                .strip_prefix(SESSION_COOKIE.as_bytes())?
                .strip_prefix(b"=")
        })
}

impl Gate {
    /// `None` when `auth` has no token: then everything is open.
    pub(super) fn new(auth: &AdminAuth) -> Option<Self> {
        let token = auth.token.clone()?;
        Some(Self {
            token,
            sessions: Default::default(),
            secure: auth.tls.is_some(),
        })
    }

    /// Whether the request carries the token as a bearer, or the session cookie.
    pub(super) fn admits(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get_all(AUTHORIZATION)
            .iter()
            .filter_map(|value| bearer(value.as_bytes()))
            .any(|token| self.token.matches(token));
        bearer || {
            let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            session_cookies(headers).any(|value| {
                // Every session compared, in time that depends on their count only.
                sessions.iter().fold(false, |found, s| {
                    constant_time_eq(s.as_bytes(), value) | found
                })
            })
        }
    }

    /// The answer to a request without credentials: the sign-in page on the dashboard, a 401
    /// that says how to authenticate elsewhere.
    pub(super) fn refuse(&self, dashboard: bool) -> Response<Full<Bytes>> {
        let mut response = if dashboard {
            self.sign_in_page(StatusCode::UNAUTHORIZED, None)
        } else {
            answer(
                StatusCode::UNAUTHORIZED,
                "{\"error\":\"unauthorized\",\"detail\":\"send Authorization: Bearer TOKEN with \
                 the token in --admin-token-file, or sign in with POST /signin\"}\n"
                    .into(),
                "application/json",
            )
        };
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
        response
    }

    /// A small page with a password field that posts to `/signin`.
    pub(super) fn sign_in_page(
        &self,
        status: StatusCode,
        error: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let error = error
            .map(|e| format!("<p class=\"error\">{e}</p>"))
            .unwrap_or_default();
        let page = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Spillway admin: sign in</title>\
             <style>body{{font-family:sans-serif;max-width:24em;margin:4em auto}}\
             .error{{color:#b00}}input{{width:100%;margin:.5em 0}}</style></head>\n\
             <body><h1>Spillway admin</h1>{error}\
             <form method=\"post\" action=\"/signin\">\
             <label for=\"token\">Admin token (the contents of --admin-token-file)</label>\
             <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
             <input type=\"submit\" value=\"Sign in\"></form></body></html>\n"
        );
        let mut response = answer(status, page, "text/html; charset=utf-8");
        response
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    /// `POST /signin` with the form field `token`: the session cookie and a redirect to the
    /// dashboard, or 401 and the page again.
    pub(super) async fn sign_in(&self, body: Incoming) -> Response<Full<Bytes>> {
        let form = match Limited::new(body, MAX_FORM_BYTES).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
                return answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the sign-in form is limited to {MAX_FORM_BYTES} bytes\n"),
                    "text/plain",
                );
            }
            Err(err) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the sign-in form: {err}\n"),
                    "text/plain",
                );
            }
        };
        let token = form_value(&form, "token").unwrap_or_default();
        if !self.token.matches(trim_end(token.as_bytes())) {
            return self.sign_in_page(StatusCode::UNAUTHORIZED, Some("That is not the token."));
        }
        let Some(session) = new_session() else {
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "browser sign-in is unavailable (no random session id); use Authorization: Bearer\n"
                    .into(),
                "text/plain",
            );
        };
        {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            if sessions.len() >= MAX_SESSIONS {
                sessions.pop_front();
            }
            sessions.push_back(session.clone());
        }
        self.redirect_with_cookie(format!(
            "{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/"
        ))
    }

    /// `POST /signout`: the session the request carries ended, its cookie cleared, back to the
    /// sign-in page.
    pub(super) fn sign_out(&self, headers: &HeaderMap) -> Response<Full<Bytes>> {
        let ended: Vec<&[u8]> = session_cookies(headers).collect();
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| !ended.iter().any(|e| constant_time_eq(s.as_bytes(), e)));
        self.redirect_with_cookie(format!(
            "{SESSION_COOKIE}=; Max-Age=0; HttpOnly; SameSite=Strict; Path=/"
        ))
    }

    fn redirect_with_cookie(&self, mut cookie: String) -> Response<Full<Bytes>> {
        if self.secure {
            cookie.push_str("; Secure");
        }
        let mut response = answer(StatusCode::SEE_OTHER, String::new(), "text/plain");
        let headers = response.headers_mut();
        headers.insert(LOCATION, HeaderValue::from_static("/"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Ok(cookie) = HeaderValue::try_from(cookie) {
            headers.insert(SET_COOKIE, cookie);
        }
        response
    }
}

/// The credentials of an `Authorization: Bearer ...` value (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| trim(rest))
}

/// Whether `candidate` equals `secret`: every byte compared whatever the first difference, by
/// `subtle`; only whether the lengths agree shows in the time taken.
fn constant_time_eq(secret: &[u8], candidate: &[u8]) -> bool {
    secret.ct_eq(candidate).into()
}

/// The percent-decoded value of `name` in an `application/x-www-form-urlencoded` body (`+` is a
/// space, `%XX` a byte), the first if it occurs twice.
fn form_value(form: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(form)
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn trim_end(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii_end()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_every_byte_and_the_length_agree() {
        assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdeF"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcde"));
        assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdef0"));
        assert!(!constant_time_eq(b"0123456789abcdef", b""));
    }

    #[test]
    fn form_values_are_percent_decoded() {
        let form = b"other=1&token=a%2Bb+c%3d%zz%4&last";
        assert_eq!(form_value(form, "token").unwrap(), "a+b c=%zz%4");
        assert_eq!(form_value(form, "last").unwrap(), "");
        assert_eq!(form_value(form, "missing"), None);
        assert_eq!(form_value(b"t%6Fken=%41%42%", "token").unwrap(), "AB%");
    }

    #[test]
    fn bearer_scheme_in_any_case() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer"), None);
    }
}
