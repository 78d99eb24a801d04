//! wait for capacity instead of failing. [`Client::acquire`] retries after the retry-after
//! that each drop names, until the request is admitted or its deadline would pass.

use std::time::Duration;

use spillway_core::decision::{Decision, NEVER};
use spillway_core::pattern::RequestAttrs;
use tokio::time::Instant;

use crate::client::Client;
use crate::identity::Headers;
use crate::rules::Step;

/// Why [`Client::acquire`] gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// Waiting `retry_after` would pass the deadline (or the cost can never fit: `retry_after` is
    /// `Duration::MAX`); nothing was waited for in vain.
    #[error(
        "bucket {bucket} of service {service} admits this request only after {retry_after:?}, past the deadline"
    )]
    Deadline {
        service: String,
        bucket: String,
        retry_after: Duration,
    },
}

impl Client {
    /// Decides the request, and while an enforcing bucket drops it, sleeps for the retry-after it
    /// names and tries again. Returns the admitting decision (`Allow`, or `ShadowDrop` when a
    /// shadow bucket would have dropped it), or an error as soon as the next wait would end after
    /// `deadline`, so a caller never sleeps only to fail.
    pub async fn acquire<H: Headers + ?Sized>(
        &self,
        attrs: &RequestAttrs<'_>,
        headers: &H,
        deadline: Instant,
    ) -> Result<Decision, AcquireError> {
        loop {
            let rules = self.rules();
            let decision = match rules.begin(self.now(), attrs, headers) {
                Step::Done(decision) => decision,
                Step::Redis(pending) => rules.finish(pending).await,
            };
            let Decision::Drop {
                bucket,
                retry_after,
            } = decision
            else {
                return Ok(decision);
            };
            let wake = (retry_after != NEVER)
                .then(|| Instant::now().checked_add(retry_after))
                .flatten();
            match wake {
                Some(wake) if wake <= deadline => tokio::time::sleep_until(wake).await,
                _ => {
                    let (service, bucket) = rules
                        .bucket(bucket)
                        .map(|b| (b.service().to_owned(), b.name().to_owned()))
                        .unwrap_or_default();
                    return Err(AcquireError::Deadline {
                        service,
                        bucket,
                        retry_after,
                    });
                }
            }
        }
    }
}
