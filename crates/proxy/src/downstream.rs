//! A downstream connection's socket: it keeps the connection's header and idle timeouts and
//! writes the proxy's `431` problem document in place of hyper's own.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::pause::{Answers, Pause};

/// A downstream connection's socket, which keeps the connection's header and idle timeouts
/// whenever the server has to wait to read from it ([`Pause`]), and writes the proxy's `431`
/// problem document in place of hyper's own bodiless one.
pub(crate) struct Downstream {
    pub(crate) io: TokioIo<TcpStream>,
    pub(crate) answers: Arc<Answers>,
    pub(crate) pause: Pause,
    /// The answer to a head over the cap ([`crate::answer::head_too_large`]).
    pub(crate) too_large: Arc<[u8]>,
    /// How much of `too_large` has been written, once hyper began its own 431.
    pub(crate) refusing: Option<usize>,
}

impl Downstream {
    /// Writes the proxy's `431` in place of hyper's: when hyper begins its own answer to a head
    /// it refused for its size (`first` is the start of what it writes), or has begun it, the
    /// problem document is written instead and hyper's `total` bytes taken as written. `None`:
    /// an ordinary write.
    fn refuse(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        total: usize,
    ) -> Option<Poll<std::io::Result<usize>>> {
        if self.refusing.is_none() {
            if !self.pause.wrote(&self.answers, first) {
                return None;
            }
            self.refusing = Some(0);
        }
        let sent = self.refusing.as_mut()?;
        while *sent < self.too_large.len() {
            match hyper::rt::Write::poll_write(Pin::new(&mut self.io), cx, &self.too_large[*sent..])
            {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(err)) => return Some(Poll::Ready(Err(err))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        Some(Poll::Ready(Ok(total)))
    }
}

impl hyper::rt::Read for Downstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => {
                // Waiting for the next request (or the rest of this one): the wait may have run
                // too long.
                match this.pause.waiting(&this.answers, cx) {
                    Some(timed_out) => Poll::Ready(Err(timed_out)),
                    None => Poll::Pending,
                }
            }
            Poll::Ready(Ok(())) => {
                this.pause.arrived(&this.answers);
                Poll::Ready(Ok(()))
            }
            failed => failed,
        }
    }
}

impl hyper::rt::Write for Downstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Some(refused) = this.refuse(cx, buf, buf.len()) {
            return refused;
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        let total = bufs.iter().map(|b| b.len()).sum();
        if let Some(refused) = this.refuse(cx, first, total) {
            return refused;
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        this.pause.flushed(&this.answers, cx);
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
