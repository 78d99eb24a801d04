//! How long a downstream connection may go without a request. A new connection has the header
//! timeout to send its first request's head; after an answer a kept-alive connection has the
//! idle timeout to begin its next request, and the header timeout again to finish that head once
//! it has begun. While a request is being answered neither runs (a slow upload or a slow upstream
//! is not the client idling; the body timeout of [`crate::forward`] watches uploads).
//!
//! An HTTP/2 connection has the idle timeout whenever no stream is open: from its preface (a
//! connection that sent only its preface is closed after the idle timeout, since gRPC clients
//! open their connections ahead of their first call), and from the end of its last stream. Frames
//! that open no stream (pings, settings) do not count as activity. Its streams end on tasks of
//! their own, so the last one to end wakes the connection ([`Answers`]) to start the clock.
//!
//! hyper's server has a header timer of its own, but it is one setting for both waits and boxes a
//! timer anew for every request. This is one timer per connection, made at its first wait and
//! moved only when it fires, so a request costs two atomic counts and two readings of the clock.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::Context;
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::time::{Instant, Sleep};

/// How many requests of one connection the server has begun and finished answering: equal when
/// the connection is between requests (on HTTP/2: no stream is open). Shared by the connection's
/// socket ([`Pause`]) and the service that answers its requests ([`Answering`]).
#[derive(Default)]
pub(crate) struct Answers {
    begun: AtomicU32,
    finished: AtomicU32,
    /// An HTTP/2 connection, whose answers finish on tasks other than the connection's.
    h2: AtomicBool,
    /// The connection's task, woken when an HTTP/2 connection's last open stream ends, so its
    /// idle clock starts then rather than at its next frame.
    idle: AtomicWaker,
}

impl Answers {
    /// A request is being answered until the returned guard is dropped: with the answer's body
    /// when it has been sent whole, or with the request's future when that ends first.
    pub(crate) fn begin(self: &Arc<Self>) -> Answering {
        self.begun.fetch_add(1, Ordering::Relaxed);
        Answering(self.clone())
    }

    /// `None` while a request is being answered, else how many have been finished.
    fn finished_if_idle(&self) -> Option<u32> {
        let finished = self.finished.load(Ordering::Acquire);
        (self.begun.load(Ordering::Relaxed) == finished).then_some(finished)
    }

    fn none_begun(&self) -> bool {
        self.begun.load(Ordering::Relaxed) == 0
    }
}

/// One request being answered (see [`Answers::begin`]).
pub(crate) struct Answering(Arc<Answers>);

impl Answering {
    /// Another answer on the same connection, begun now: an upgrade's tunnel, which holds the
    /// connection's clock stopped for as long as it runs (a WebSocket may be quiet for minutes
    /// and is not a client idling between requests).
    pub(crate) fn another(&self) -> Answering {
        self.0.begin()
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let answers = &self.0;
        let finished = answers.finished.fetch_add(1, Ordering::AcqRel) + 1;
        // HTTP/1.1 answers finish on the connection's own task, which looks at the counts next.
        if answers.h2.load(Ordering::Relaxed) && answers.begun.load(Ordering::Acquire) == finished {
            answers.idle.wake();
        }
    }
}

/// The clock of one downstream connection's waits for a request, kept by its socket.
pub(crate) struct Pause {
    header_timeout: Duration,
    idle_timeout: Duration,
    /// When the connection is closed if no request has begun by then; `None` while one is being
    /// answered.
    deadline: Option<Instant>,
    /// The answers finished when the socket last looked: a change means the connection has gone
    /// idle since.
    seen: u32,
    /// Whether the awaited request's head has begun to arrive (the header timeout runs).
    heading: bool,
    /// An HTTP/2 connection: only the idle timeout, while no stream is open.
    h2: bool,
    /// Made at the first wait, and set no later than `deadline` whenever one is pending, so it
    /// wakes the connection in time; when it fires early it is moved on, not made anew.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Pause {
    /// The clock of a connection accepted now: its first request's head is due within the
    /// header timeout.
    pub(crate) fn new(header_timeout: Duration, idle_timeout: Duration) -> Self {
        Self {
            header_timeout,
            idle_timeout,
            deadline: Some(Instant::now() + header_timeout),
            seen: 0,
            heading: true,
            h2: false,
            timer: None,
        }
    }

    /// The server writes `first` (the start of what it writes) to the connection. Returns
    /// whether that is the HTTP/1.1 server's own `431` to a head it refused for its size.
    ///
    /// While a head is awaited and has begun to arrive, with no answer finished since the
    /// connection last looked (so this is not the tail of an answer just sent), an HTTP/1.1
    /// server speaks only to refuse that head, and then closes the connection. Before any request
    /// has begun, anything else it writes is an HTTP/2 server's preface, so from then on the
    /// connection is an HTTP/2 one, waiting for its first stream within the idle timeout.
    pub(crate) fn wrote(&mut self, answers: &Answers, first: &[u8]) -> bool {
        if self.h2
            || first.is_empty()
            || !self.heading
            || answers.finished_if_idle() != Some(self.seen)
        {
            return false;
        }
        if first.starts_with(b"HTTP/1.") {
            return first.get(8..13) == Some(&b" 431 "[..]);
        }
        if answers.none_begun() {
            self.h2 = true;
            self.heading = false;
            self.deadline = Some(Instant::now() + self.idle_timeout);
            answers.h2.store(true, Ordering::Relaxed);
        }
        false
    }

    /// A read from the connection gave bytes (or the end): the awaited request's head has begun,
    /// so it is due within the header timeout, unless the idle deadline comes sooner. On HTTP/2,
    /// bytes are frames, and only a stream opening ends the idle wait.
    pub(crate) fn arrived(&mut self, answers: &Answers) {
        if self.look(answers).is_some() && !self.heading && !self.h2 {
            self.heading = true;
            let due = Instant::now() + self.header_timeout;
            self.deadline = self.deadline.map(|deadline| deadline.min(due));
        }
    }

    /// A read from the connection has to wait: watches the clock, unless a request is being
    /// answered. An error closes the connection: its wait has outlasted its timeout.
    pub(crate) fn waiting(&mut self, answers: &Answers, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.h2 {
            // Before looking, so a stream that ends after the look wakes this task.
            answers.idle.register(cx.waker());
        }
        self.look(answers)?;
        self.watch(cx)
    }

    /// The server flushed what it wrote. When that was the end of an answer, the connection
    /// waits for its next request from now on, yet hyper's server reads from it again only when
    /// bytes arrive: so the clock is watched from here.
    pub(crate) fn flushed(&mut self, answers: &Answers, cx: &mut Context<'_>) {
        if self.look(answers) == Some(true) {
            // The idle deadline was set just now, so it has not passed.
            let _ = self.watch(cx);
        }
    }

    /// Brings the deadline up to date: `None` while a request is being answered (a stream is
    /// open), else whether the connection has only now been seen to wait for a request.
    fn look(&mut self, answers: &Answers) -> Option<bool> {
        let Some(finished) = answers.finished_if_idle() else {
            self.deadline = None;
            return None;
        };
        if finished == self.seen {
            return Some(false);
        }
        // An answer has been sent since the last look: the idle wait begins.
        self.seen = finished;
        self.heading = false;
        self.deadline = Some(Instant::now() + self.idle_timeout);
        Some(true)
    }

    /// Polls the timer while the connection waits, registering the task's waker with it.
    fn watch(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let deadline = self.deadline?;
        // No deadline is ever set sooner than the shorter timeout from now, so a timer never
        // set later than that from when it was last set cannot sleep past any deadline.
        let step = self.header_timeout.min(self.idle_timeout);
        let timer = self.timer.get_or_insert_with(|| {
            Box::pin(tokio::time::sleep_until(
                deadline.min(Instant::now() + step),
            ))
        });
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                let timeout = if self.heading {
                    self.header_timeout
                } else {
                    self.idle_timeout
                };
                return Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no request within {timeout:?}"),
                ));
            }
            timer.as_mut().reset(deadline.min(now + step));
        }
    }
}
