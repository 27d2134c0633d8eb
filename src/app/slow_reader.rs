//! The slowest a client may take what the server sends. The write timeout alone cuts a client
//! that takes nothing for its length; one that takes a little now and then (a kilobyte every ten
//! seconds) never trips it, and could hold a large answer, and the memory behind it, for hours.
//!
//! While the connection has more to send than the client has taken (a write that did not go
//! whole), the client must take at least [`MIN_SEND_BYTES_PER_SEC`] on average after a grace of
//! the write timeout, as [`send_deadline`] allows an answer: past that, writes fail and hyper
//! closes the connection, dropping the answer. Idle connections, and clients that keep up, are
//! never measured.
//!
//! [`MIN_SEND_BYTES_PER_SEC`]: crate::http::guard::MIN_SEND_BYTES_PER_SEC
//! [`send_deadline`]: crate::http::guard::send_deadline

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::http::guard::MIN_SEND_BYTES_PER_SEC;

/// An IO that fails its writes once the client reads slower than the floor while the server
/// has more to send.
pub struct SlowReaderCut<S> {
    inner: S,
    grace: Duration,
    min_bytes_per_sec: u64,
    /// Since when the server has had more to send, and what had been written then.
    backlog: Option<Backlog>,
    written: u64,
    /// Fires when the floor would be passed with nothing more taken: it wakes the writer, so a
    /// connection that hyper no longer polls for a stalled write is still cut on time.
    alarm: Pin<Box<Sleep>>,
}

#[derive(Debug, Clone, Copy)]
struct Backlog {
    since: Instant,
    written: u64,
}

impl<S> SlowReaderCut<S> {
    /// `inner`, cut when a backlogged client reads slower than 1 MiB/s after `grace`.
    pub fn new(inner: S, grace: Duration) -> Self {
        Self::with_floor(inner, grace, MIN_SEND_BYTES_PER_SEC)
    }

    fn with_floor(inner: S, grace: Duration, min_bytes_per_sec: u64) -> Self {
        SlowReaderCut {
            inner,
            grace,
            min_bytes_per_sec: min_bytes_per_sec.max(1),
            backlog: None,
            written: 0,
            alarm: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// When the client, taking nothing more, falls below the floor.
    fn due(&self, backlog: Backlog) -> Instant {
        let taken = self.written - backlog.written;
        let earned = Duration::from_secs_f64(taken as f64 / self.min_bytes_per_sec as f64);
        backlog.since + self.grace + earned
    }

    /// After a write that `sent` of `wanted` bytes (`None`: none, it would block): starts or
    /// ends the backlog, and fails when the client is past the floor.
    fn account(
        &mut self,
        cx: &mut Context<'_>,
        sent: Option<usize>,
        wanted: usize,
    ) -> io::Result<()> {
        if let Some(sent) = sent {
            self.written += sent as u64;
            if sent >= wanted {
                self.backlog = None;
                return Ok(());
            }
        }
        let now = Instant::now();
        let backlog = *self.backlog.get_or_insert(Backlog {
            since: now,
            written: self.written,
        });
        let due = self.due(backlog);
        if now >= due {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client reads slower than the server's floor",
            ));
        }
        self.alarm.as_mut().reset(due);
        // Registers the waker: hyper is woken to write again when the alarm fires.
        let _ = self.alarm.as_mut().poll(cx);
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SlowReaderCut<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SlowReaderCut<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.settle(cx, polled, buf.len())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let wanted = bufs.iter().map(|buf| buf.len()).sum();
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.settle(cx, polled, wanted)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> SlowReaderCut<S> {
    fn settle(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<usize>>,
        wanted: usize,
    ) -> Poll<io::Result<usize>> {
        let sent = match &polled {
            Poll::Ready(Ok(sent)) => Some(*sent),
            Poll::Ready(Err(_)) => return polled,
            Poll::Pending => None,
        };
        match self.account(cx, sent, wanted) {
            Ok(()) => polled,
            Err(error) => Poll::Ready(Err(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client that takes a trickle while much is left to send is cut once the grace and what
    /// it took have run out; one that takes everything at once never is.
    #[tokio::test(start_paused = true)]
    async fn a_trickling_reader_is_cut_and_a_quick_one_is_not() {
        // A pipe holding 1 KiB: the writer's answer is 64 KiB.
        let (server, mut client) = tokio::io::duplex(1024);
        let mut server = SlowReaderCut::with_floor(server, Duration::from_secs(30), 1024);
        let writer = tokio::spawn(async move {
            let answer = vec![b'x'; 64 * 1024];
            server.write_all(&answer).await
        });
        let started = Instant::now();
        let mut taken = 0;
        let mut buffer = [0; 100];
        // 100 bytes every 10 s: far below 1 KiB/s.
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            match client.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => taken += n,
            }
            if writer.is_finished() {
                break;
            }
        }
        let cut = writer.await.unwrap();
        assert!(cut.is_err(), "the trickling reader is cut");
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_secs(30) && elapsed < Duration::from_secs(60),
            "cut after the grace, before the answer could be taken: {elapsed:?}, {taken} bytes"
        );

        let (server, mut client) = tokio::io::duplex(1024);
        let mut server = SlowReaderCut::with_floor(server, Duration::from_secs(30), 1024);
        let writer = tokio::spawn(async move {
            let answer = vec![b'x'; 64 * 1024];
            server.write_all(&answer).await
        });
        let mut all = Vec::new();
        client.read_to_end(&mut all).await.unwrap();
        assert_eq!(all.len(), 64 * 1024);
        writer.await.unwrap().expect("a quick reader takes it all");
    }
}
