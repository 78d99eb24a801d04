//! One request's way through the proxy: checked (its `Host`, its transfer coding), decided,
//! answered by the proxy or forwarded, and counted.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use spillway_client::Step;
use spillway_core::decision::Decision;
use tokio::sync::watch;
use tracing::Instrument;

use crate::answer::{self, Refusal};
use crate::forward::{ForwardError, Forwarded, Relay, Upstream, UpstreamLink};
use crate::forwarded::{Peer, forwarded};
use crate::options::ForwardedFields;
use crate::pause::Answering;
use crate::request_id::{self, REQUEST_ID};
use crate::shared::Shared;
use crate::upgrade::{Ask, upgrade_asked};
use crate::usage::Meter;

/// What every request a worker serves needs: the proxy's shared state, the worker's upstream,
/// which forwarding fields to add, and the drain deadline's signal.
pub(crate) struct Requests {
    pub(crate) shared: Arc<Shared>,
    pub(crate) upstream: Upstream,
    pub(crate) forwarded: ForwardedFields,
    /// Turns true at the drain deadline: requests still waiting on the upstream are answered.
    pub(crate) cut: watch::Sender<bool>,
}

/// The body of every response: the upstream's, streamed, or one of ours (`Either` rather than a
/// boxed body, so forwarding allocates no box per response), with its request counted as being
/// answered until it has been sent whole ([`crate::pause::Answers`]).
pub(crate) struct Body {
    inner: Either<Relay, Full<Bytes>>,
    /// The token budgets the response's cost is read for, settled when the body ends or is
    /// dropped; `None` for every response of a request that matched none.
    meter: Option<Box<Meter>>,
    _answering: Answering,
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = <Either<Relay, Full<Bytes>> as hyper::body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(meter) = &mut this.meter {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => meter.frame(frame),
                Poll::Ready(None) | Poll::Ready(Some(Err(_))) => meter.finish(),
                Poll::Pending => {}
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What is wrong with a request's `Host`, if anything: two of them (which would the upstream
/// route by?), or none on HTTP/1.1, which requires it (RFC 9112 §3.2).
fn host_fault(request: &Request<Incoming>) -> Option<&'static str> {
    let mut hosts = request.headers().get_all(http::header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (_, Some(_)) => Some("the request has more than one Host header"),
        (None, None) if request.version() == http::Version::HTTP_11 => {
            Some("an HTTP/1.1 request needs a Host header")
        }
        _ => None,
    }
}

/// The transfer coding of an HTTP/1.1 request's body when it is not `chunked` alone: the proxy
/// forwards bodies by their framing, and a coding under the chunks (`gzip, chunked`) would reach
/// the upstream unannounced. hyper has already refused a coding list that does not end in
/// `chunked` (RFC 9112 §6.3), so what is left here is a list with more than `chunked` in it.
fn coding_fault(request: &Request<Incoming>) -> Option<String> {
    let mut codings = request
        .headers()
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    let first = codings.next()?;
    if first.eq_ignore_ascii_case(b"chunked") && codings.next().is_none() {
        return None;
    }
    let all: Vec<String> = request
        .headers()
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .collect();
    Some(all.join(", "))
}

pub(crate) async fn handle(
    requests: Arc<Requests>,
    peer: Arc<Peer>,
    link: Arc<UpstreamLink>,
    answering: Answering,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let shared = &requests.shared;
    let id = shared.request_ids.of(request.headers_mut());
    let counted = |answering, inner| Body {
        inner,
        meter: None,
        _answering: answering,
    };
    // The proxy's own answers name the request, so a client can quote it.
    let own = |answering, mut response: Response<Full<Bytes>>| {
        response.headers_mut().insert(REQUEST_ID, id.clone());
        Ok(response.map(|body| counted(answering, Either::Right(body))))
    };
    let grpc = answer::is_grpc(request.headers());
    let refused = |answering, refusal, response| {
        shared.refusals.count(refusal);
        own(answering, response)
    };
    if let Some(detail) = host_fault(&request) {
        return refused(answering, Refusal::BadHost, answer::bad_host(detail));
    }
    // A request with a transfer coding has a body; most have none, and skip the lookup.
    if !hyper::body::Body::is_end_stream(request.body())
        && let Some(coding) = coding_fault(&request)
    {
        return refused(
            answering,
            Refusal::UnsupportedCoding,
            answer::unsupported_coding(&coding),
        );
    }
    let rules = shared.client.rules();
    // One lookup for a request without an `upgrade` field.
    let upgrade = match upgrade_asked(&request, &rules.config().proxy) {
        Ask::None => None,
        Ask::Removed => {
            shared.upgrades_removed.fetch_add(1, Ordering::Relaxed);
            None
        }
        Ask::Allowed(upgrade) => Some(upgrade),
    };
    // The buckets an upgrade's handshake matches, named for counting its tunnel by bucket.
    let mut upgrade_buckets = Vec::new();
    let mut charges = spillway_client::BudgetCharges::new();
    let (step, tier) = {
        // The normalised path lives here, on the stack, only until the decision has begun.
        let mut buffer = spillway_client::PathBuffer::new();
        let attrs = match rules.identity().attrs(
            request.uri().path(),
            request.headers(),
            Some(&peer.ip),
            &mut buffer,
        ) {
            Ok(attrs) => attrs,
            // Decided on one copy of a header and served with both: refused before deciding.
            Err(bad) => {
                return refused(
                    answering,
                    Refusal::BadIdentity,
                    answer::bad_identity(&bad, grpc),
                );
            }
        };
        if upgrade.is_some() {
            rules.matching(&attrs, |bucket| {
                upgrade_buckets.push((bucket.service().to_owned(), bucket.name().to_owned()));
            });
        }
        (
            rules.begin_charged(shared.client.now(), &attrs, request.headers(), &mut charges),
            attrs.criticality,
        )
    };
    // Only requests that match a `store: redis` bucket wait here, for one Redis call each.
    let decision = match step {
        Step::Done(decision) => decision,
        Step::Redis(pending) => rules.finish(pending).await,
    };
    if let Decision::Drop {
        bucket,
        retry_after,
    } = decision
        && let Some(bucket) = rules.bucket(bucket)
    {
        charges.cancel(shared.client.now());
        return own(answering, answer::dropped(bucket, retry_after, grpc));
    }
    // What a hop behind the proxy sees is the tier applied, not an untrusted claim.
    rules
        .identity()
        .rewrite_criticality(request.headers_mut(), tier);
    drop(rules);
    let permit = match shared.concurrency.try_acquire(tier) {
        Ok(permit) => permit,
        Err(rejected) => {
            charges.cancel(shared.client.now());
            return own(answering, answer::overloaded(&rejected, grpc));
        }
    };
    forwarded(request.headers_mut(), &peer, requests.forwarded);
    let sent = std::time::Instant::now();
    let mut cut = requests.cut.subscribe();
    let forwarded = tokio::select! {
        biased;
        // A span only when debug lines are on: the forwarding's own lines then name the request.
        forwarded = requests
            .upstream
            .forward(request, &link, grpc, upgrade)
            .instrument(tracing::debug_span!("request", request_id = request_id::text(&id))) => forwarded,
        _ = cut.wait_for(|cut| *cut) => {
            shared.drain_cut.fetch_add(1, Ordering::Relaxed);
            charges.cancel(shared.client.now());
            tracing::warn!(
                request_id = request_id::text(&id),
                "a request still waiting on the upstream at the drain deadline was answered 503"
            );
            return own(answering, answer::draining(grpc));
        }
    };
    // The round trip to the response's head is the algorithm's sample; a refusal of the
    // client's fault or an upgrade says nothing about the upstream's load and only frees its place.
    // What the upstream answered is charged when its body ends; a request it never answered
    // (or the proxy answered) gives back what it reserved.
    let mut meter = None;
    let response = match forwarded {
        Ok(Forwarded::Answer(mut response)) => {
            permit.completed(sent.elapsed());
            if !charges.is_empty() {
                answer::budget_headers(response.headers_mut(), &charges);
                meter = Some(Box::new(Meter::new(
                    shared.clone(),
                    std::mem::take(&mut charges).into_vec(),
                    response.headers(),
                )));
            }
            response.map(Either::Left)
        }
        Ok(Forwarded::Refused(refusal, response)) => {
            drop(permit);
            shared.refusals.count(refusal);
            response.map(Either::Left)
        }
        Ok(Forwarded::Tunnel(response, tunnel)) => {
            drop(permit);
            shared.upgrades.fetch_add(1, Ordering::Relaxed);
            if !upgrade_buckets.is_empty()
                && let Ok(mut counts) = shared.bucket_upgrades.lock()
            {
                for bucket in upgrade_buckets {
                    *counts.entry(bucket).or_default() += 1;
                }
            }
            let open = answering.another();
            let span = tracing::debug_span!("request", request_id = request_id::text(&id));
            tokio::spawn(async move {
                // The drain deadline ends a tunnel like any request still open then.
                tokio::select! {
                    ended = tunnel.run() => match ended {
                        Ok((up, down)) => tracing::debug!("an upgraded connection ended: {up} bytes up, {down} down"),
                        Err(err) => tracing::debug!("an upgraded connection ended: {err}"),
                    },
                    _ = cut.wait_for(|cut| *cut) => {
                        tracing::debug!("an upgraded connection was closed at the drain deadline");
                    }
                }
                drop(open);
            }.instrument(span));
            response.map(Either::Left)
        }
        Err(err @ ForwardError::Handshake(_)) => {
            // Not a sample of the upstream's load: it answered, with the wrong handshake.
            drop(permit);
            shared.upgrades_bad_switch.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = request_id::text(&id),
                "an upgrade was refused: {err}; answered 502 and the connections closed"
            );
            let mut answer = answer::upstream_failed(&err, grpc);
            answer.headers_mut().insert(REQUEST_ID, id.clone());
            // Whatever the client sends next was meant for the tunnel: it is not read.
            answer.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            answer.map(Either::Right)
        }
        Err(err) => {
            permit.failed();
            shared.upstream_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = request_id::text(&id),
                "upstream request failed: {err}"
            );
            let mut answer = match err {
                ForwardError::Timeout(_) => answer::upstream_timed_out(&err, grpc),
                _ => answer::upstream_failed(&err, grpc),
            };
            answer.headers_mut().insert(REQUEST_ID, id.clone());
            answer.map(Either::Right)
        }
    };
    // Not the upstream's answer (an upgrade, a refusal, a failure): nothing to charge but
    // the reservation back.
    charges.cancel(shared.client.now());
    Ok(response.map(|body| Body {
        inner: body,
        meter,
        _answering: answering,
    }))
}
