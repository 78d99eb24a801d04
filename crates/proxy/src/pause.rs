//! How long a downstream connection may go without a request. A new connection has the header
//! timeout to send its first request's head; after an answer a kept-alive connection has the
//! idle timeout to begin its next request, and the header timeout again to finish that head once
//! it has begun. While a request is being answered neither runs (a slow upload or a slow upstream
//! is not the client idling), and on an HTTP/2 connection neither ever runs: its streams come and
//! go on a connection that is meant to stay open.
//!
//! hyper's server has a header timer of its own, but it is one setting for both waits and boxes a
//! timer anew for every request. This is one timer per connection, made at its first wait and
//! moved only when it fires, so a request costs two atomic counts and two readings of the clock.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How many requests of one connection the server has begun and finished answering: equal when
/// the connection is between requests. Shared by the connection's socket ([`Pause`]) and the
/// service that answers its requests ([`Answering`]).
#[derive(Default)]
pub(crate) struct Answers {
    begun: AtomicU32,
    finished: AtomicU32,
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
        let finished = self.finished.load(Ordering::Relaxed);
        (self.begun.load(Ordering::Relaxed) == finished).then_some(finished)
    }

    fn none_begun(&self) -> bool {
        self.begun.load(Ordering::Relaxed) == 0
    }
}

/// One request being answered (see [`Answers::begin`]).
pub(crate) struct Answering(Arc<Answers>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
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
    /// An HTTP/2 connection: no timeout.
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

    /// The server wrote to the connection. Before any request has begun, only an HTTP/2 server
    /// does (its preface; an HTTP/1.1 server speaks first only to refuse a malformed head, and
    /// then closes the connection), so from then on the connection has no timeout.
    pub(crate) fn wrote(&mut self, answers: &Answers) {
        if !self.h2 && answers.none_begun() {
            self.h2 = true;
            self.deadline = None;
        }
    }

    /// A read from the connection gave bytes (or the end): the awaited request's head has begun,
    /// so it is due within the header timeout, unless the idle deadline comes sooner.
    pub(crate) fn arrived(&mut self, answers: &Answers) {
        if self.look(answers).is_some() && !self.heading {
            self.heading = true;
            let due = Instant::now() + self.header_timeout;
            self.deadline = self.deadline.map(|deadline| deadline.min(due));
        }
    }

    /// A read from the connection has to wait: watches the clock, unless a request is being
    /// answered. An error closes the connection: its wait has outlasted its timeout.
    pub(crate) fn waiting(&mut self, answers: &Answers, cx: &mut Context<'_>) -> Option<io::Error> {
        self.look(answers)?;
        self.watch(cx)
    }

    /// The server flushed what it wrote. When that was the end of an answer, the connection
    /// waits for its next request from now on, yet hyper's server reads from it again only when
    /// bytes arrive: so the clock is watched from here, and `true` tells the socket to watch its
    /// idle upstream connection too.
    pub(crate) fn flushed(&mut self, answers: &Answers, cx: &mut Context<'_>) -> bool {
        if self.look(answers) != Some(true) {
            return false;
        }
        // The idle deadline was set just now, so it has not passed.
        let _ = self.watch(cx);
        true
    }

    /// Brings the deadline up to date: `None` while a request is being answered (or on an HTTP/2
    /// connection), else whether the connection has only now been seen to wait for a request.
    fn look(&mut self, answers: &Answers) -> Option<bool> {
        if self.h2 {
            return None;
        }
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
