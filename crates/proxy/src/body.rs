//! A request body on its way upstream: the body timeout (how long it may make no progress before
//! the request is cut, [`Progress`]) and the signal of its end ([`Sent`]), from which the
//! upstream timeout starts.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use crate::hop::filter_trailers;

/// The body timeout of one request body: how long the proxy has been ready for its next frame
/// without one coming. The clock runs only while the body is polled and has nothing (not while
/// the upstream is slow to take what came), and restarts at every frame, as nginx's
/// `client_body_timeout` runs between two reads.
pub(crate) struct Progress {
    timeout: Duration,
    /// When the current wait for a frame began; `None` between waits.
    since: Option<Instant>,
    /// Made at the body's first wait, and moved on only when it fires early: one timer a body.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Progress {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            since: None,
            timer: None,
        }
    }

    /// The body gave a frame (or ended): the next wait starts afresh.
    fn advanced(&mut self) {
        self.since = None;
    }

    /// The body has nothing yet: whether it has now had nothing for the whole timeout. Registers
    /// the task to be woken when it will have.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = *self.since.get_or_insert_with(Instant::now) + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if Instant::now() >= deadline {
                return true;
            }
            // Set for an earlier wait that got its frame in time.
            timer.as_mut().reset(deadline);
        }
    }

    /// The next frame of `body`, or the timeout once the body has made no progress for it.
    pub(crate) fn poll_frame<B: Body + Unpin>(
        progress: &mut Option<Self>,
        body: &mut B,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<FrameOf<B>>, Duration>> {
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(progress) = progress {
                    progress.advanced();
                }
                Poll::Ready(Ok(frame))
            }
            Poll::Pending => match progress {
                Some(progress) => {
                    if progress.stalled(cx) {
                        Poll::Ready(Err(progress.timeout))
                    } else {
                        Poll::Pending
                    }
                }
                None => Poll::Pending,
            },
        }
    }
}

/// One frame of a body `B`, or its error.
type FrameOf<B> = Result<Frame<<B as Body>::Data>, <B as Body>::Error>;

/// How a request body ended, told to the request waiting for its answer.
#[derive(Debug)]
pub(crate) enum BodyEnd {
    /// Sent whole: the upstream timeout runs from here.
    Whole,
    /// Cut after making no progress for this long, before any answer: answered 408.
    Stalled(Duration),
    /// The client's body failed (a reset stream, a malformed frame) before any answer:
    /// answered 400.
    Broken(hyper::Error),
}

/// Why a request body stopped short.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the client's request body failed")]
    Read,
    #[error("the request body made no progress for {0:?}")]
    Stalled(Duration),
    /// Over HTTP/1.1, the upstream's answer came and was relayed whole before the body was
    /// sent whole: the rest is not sent, and the connection, which would need the rest before
    /// another request, closes.
    #[error("the upstream answered before it had the whole request body")]
    Answered,
}

/// What the end of the waiting for an answer means to a body not yet sent whole ([`Sent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Early {
    /// HTTP/2: the exchange is a stream of the upstream's choosing (a gRPC bidirectional call),
    /// and the body goes on, with no body timeout.
    Stream,
    /// HTTP/1.1: the waiting ends when the answer has been relayed whole (its body holds the
    /// signal), and the body is cut then.
    Cut,
}

/// A request body that says when it has been sent whole, so the upstream timeout runs from
/// then: an upload that takes longer than the timeout is not cut off, only an upstream that
/// keeps a whole request unanswered. Until the upstream's answer begins it also keeps the body
/// timeout, and when that passes it ends the body with an error (so the upstream stream is
/// reset) and says so; once an answer has begun the exchange is a stream of the upstream's
/// choosing (a gRPC bidirectional call) and the body may pause as long as it likes. Over
/// HTTP/1.1 the answer's body keeps the signal, and an answer relayed whole before the request's
/// body was sent whole ends the body there ([`Early::Cut`]).
pub(crate) struct Sent<B> {
    /// `None`: the request has no body.
    body: Option<B>,
    done: Option<oneshot::Sender<BodyEnd>>,
    progress: Option<Progress>,
    early: Early,
}

impl<B: Body> Sent<B> {
    /// Wraps `body`, and returns the signal of its end, or `None` when it has ended already
    /// (no body): then nothing is allocated.
    pub(crate) fn new(
        body: B,
        body_timeout: Option<Duration>,
        early: Early,
    ) -> (Self, Option<oneshot::Receiver<BodyEnd>>) {
        if body.is_end_stream() {
            return (Self::none(early), None);
        }
        let (done, sent) = oneshot::channel();
        (
            Self {
                body: Some(body),
                done: Some(done),
                progress: body_timeout.map(Progress::new),
                early,
            },
            Some(sent),
        )
    }

    /// No body at all: a request that came without one (its empty body let go), or the copy of
    /// one that goes out again.
    pub(crate) fn none(early: Early) -> Self {
        Self {
            body: None,
            done: None,
            progress: None,
            early,
        }
    }
}

impl<B: Body<Error = hyper::Error> + Unpin> Body for Sent<B> {
    type Data = B::Data;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let answered = this.done.as_ref().is_some_and(oneshot::Sender::is_closed);
        if answered && this.early == Early::Cut {
            this.done = None;
            return Poll::Ready(Some(Err(BodyError::Answered)));
        }
        // The answer has begun (the request dropped its end of the signal): no body timeout.
        if answered || this.done.is_none() {
            this.progress = None;
        }
        let polled = Progress::poll_frame(&mut this.progress, body, cx);
        // Waiting for the client: the answer's end must wake the body too, to cut it.
        if polled.is_pending()
            && this.early == Early::Cut
            && let Some(done) = this.done.as_mut()
            && done.poll_closed(cx).is_ready()
        {
            this.done = None;
            return Poll::Ready(Some(Err(BodyError::Answered)));
        }
        let frame = match ready!(polled) {
            Ok(frame) => frame,
            Err(after) => {
                if let Some(done) = this.done.take() {
                    let _ = done.send(BodyEnd::Stalled(after));
                }
                return Poll::Ready(Some(Err(BodyError::Stalled(after))));
            }
        };
        let mut frame = match frame {
            None => None,
            Some(Ok(frame)) => Some(frame),
            Some(Err(err)) => {
                if let Some(done) = this.done.take() {
                    let _ = done.send(BodyEnd::Broken(err));
                }
                return Poll::Ready(Some(Err(BodyError::Read)));
            }
        };
        if let Some(trailers) = frame.as_mut().and_then(Frame::trailers_mut) {
            filter_trailers(trailers);
        }
        if (frame.is_none() || body.is_end_stream())
            && let Some(done) = this.done.take()
        {
            let _ = done.send(BodyEnd::Whole);
        }
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
