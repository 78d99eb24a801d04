//! A small blocking client of the rules service, for the `spillway rules` commands and tests.

use std::time::Duration;

use serde_json::Value;
use ureq::Agent;

/// Why a call to the rules API did not return what was asked: the caller's side of the
/// service's [`ApiError`](crate::problem::ApiError) answers, plus the calls that got none.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the rules service at {server}: {source}")]
    Transport {
        server: String,
        #[source]
        source: ureq::Error,
    },
    /// The service answered with an error status; `detail` is its problem document's.
    #[error("{status}: {detail}")]
    Status { status: u16, detail: String },
    #[error("the rules service answered something that is not JSON: {0}")]
    Body(String),
}

/// What the rules service answered: status, selected headers and the body as JSON (`Null` when
/// empty).
#[derive(Debug, Clone)]
pub struct RulesResponse {
    pub status: u16,
    pub etag: Option<String>,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    /// The `link` header: a full page of `/v1/audit` names the next one there.
    pub link: Option<String>,
    pub body: Value,
}

impl RulesResponse {
    /// The response when its status is a success, else its problem as an error.
    pub fn ok(self) -> Result<Self, CallError> {
        if (200..300).contains(&self.status) {
            Ok(self)
        } else {
            let detail = self.body["detail"]
                .as_str()
                .map_or_else(|| self.body.to_string(), str::to_owned);
            Err(CallError::Status {
                status: self.status,
                detail,
            })
        }
    }
}

/// A blocking client of the rules service's REST API (SPEC §4), one bearer token per client.
pub struct RulesClient {
    server: String,
    token: Option<String>,
    agent: Agent,
}

impl RulesClient {
    pub fn new(server: &str, token: Option<String>) -> Self {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        RulesClient {
            server: server.trim_end_matches('/').to_owned(),
            token,
            agent,
        }
    }

    /// Sends a request; `if_match` goes in the `if-match` header.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<RulesResponse, CallError> {
        let url = format!("{}{path}", self.server);
        let mut request = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(tag) = if_match {
            request = request.header("if-match", tag);
        }
        let transport = |source| CallError::Transport {
            server: self.server.clone(),
            source,
        };
        let response = match body {
            Some(text) => {
                let request = request
                    .header("content-type", "application/json")
                    .body(text.to_owned())
                    .map_err(|e| CallError::Body(e.to_string()))?;
                self.agent.run(request)
            }
            None => {
                let request = request
                    .body(())
                    .map_err(|e| CallError::Body(e.to_string()))?;
                self.agent.run(request)
            }
        }
        .map_err(transport)?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status().as_u16();
        let etag = header("etag");
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let link = header("link");
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| CallError::Body(e.to_string()))?;
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok(RulesResponse {
            status,
            etag,
            retry_after,
            content_type,
            link,
            body,
        })
    }

    pub fn get(&self, path: &str) -> Result<RulesResponse, CallError> {
        self.send("GET", path, None, None)
    }

    pub fn post(&self, path: &str, body: &str) -> Result<RulesResponse, CallError> {
        self.send("POST", path, Some(body), None)
    }
}
