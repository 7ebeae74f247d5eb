//! The read side of a client connection, watched even while a request of it waits.
//!
//! Requests are read one frame at a time ([`read_frame`](super::frame::read_frame) over
//! this type's [`AsyncRead`]). While a request waits in a purgatory, [`until_closed`]
//! keeps reading the socket so that a client that leaves (end of stream or reset) is seen
//! at once; bytes a client pipelines meanwhile are kept in a buffer and served to the next
//! frame reads before the socket.
//!
//! Invariants:
//! - No byte is lost or reordered: buffered bytes are always read before the socket's.
//! - The socket is always read while a request waits, however much the client pipelines,
//!   so a client that leaves is always seen (issue #23: a socket left unread behind 1 MiB
//!   hid the end of stream of clients that had gone). What it may hold is bounded by the
//!   connection's account instead ([`ConnectionBudget`]): every byte read from the socket
//!   is held there until its frame is freed (`connection.rs` charges each frame); a read
//!   the account refuses ends the watch with [`Left::OverBudget`] (or fails the frame
//!   read), and the connection is closed.
//! - Bytes waiting behind a request are timed like a partial frame: each buffered byte
//!   remembers when it arrived ([`oldest_arrival`]), and a watch during which the oldest
//!   of them has waited `frame_read_timeout` ends with [`Left::WaitedTooLong`]. However
//!   many long polls a client pipelines, what is behind them is held for one
//!   `frame_read_timeout` at most (issue #29, finding 4).
//!   The arrival times are kept to 1/64 of that timeout (at most 65 entries however the
//!   bytes trickle in), which may date a byte earlier than it came, never later.
//! - An idle or waiting connection holds no buffer: it is allocated when bytes arrive
//!   during a wait and released once read.
//!
//! [`until_closed`]: ClientReader::until_closed
//! [`oldest_arrival`]: ClientReader::oldest_arrival

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::time::Instant;

use super::request_budget::{ConnectionBudget, OverBudget};

/// Bytes read at most per read while a request waits (into a buffer on the stack, so a
/// waiting connection that receives nothing allocates nothing).
const READ_CHUNK: usize = 16 * 1024;

/// The arrival times of buffered bytes are kept to this fraction of the frame read timeout.
const ARRIVAL_GRAIN: u32 = 64;

/// How a client left.
#[derive(Debug)]
pub enum Left {
    /// End of stream: the client closed (or shut down its sending side).
    Closed,
    /// The socket failed (typically a reset).
    Failed(io::Error),
    /// It pipelined more than the request budget lets it hold.
    OverBudget(OverBudget),
    /// Bytes it pipelined waited longer than the frame read timeout.
    WaitedTooLong(Duration),
}

impl fmt::Display for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Left::Closed => write!(f, "the client closed the connection"),
            Left::Failed(e) => write!(f, "socket error: {e}"),
            Left::OverBudget(e) => write!(f, "pipelined {e}"),
            Left::WaitedTooLong(limit) => write!(
                f,
                "pipelined bytes waited behind its requests longer than {} ms \
                 (--frame-read-timeout-ms)",
                limit.as_millis()
            ),
        }
    }
}

/// The read half of a client connection with what the client pipelined during a wait.
pub struct ClientReader {
    socket: OwnedReadHalf,
    pending: BytesMut,
    /// Chunks of `pending` as they arrived: the stream position just past each, and when.
    arrivals: VecDeque<(u64, Instant)>,
    /// Bytes ever put into `pending`, and taken out of it.
    buffered_total: u64,
    taken_total: u64,
    budget: ConnectionBudget,
}

impl ClientReader {
    /// Reads from `socket`, counting what it holds in `budget`.
    pub fn new(socket: OwnedReadHalf, budget: ConnectionBudget) -> Self {
        ClientReader {
            socket,
            pending: BytesMut::new(),
            arrivals: VecDeque::new(),
            buffered_total: 0,
            taken_total: 0,
            budget,
        }
    }

    /// The account the bytes read are held in.
    pub fn budget(&self) -> &ConnectionBudget {
        &self.budget
    }

    /// Records that the bytes up to `buffered_total` arrived `now`. Chunks arriving within
    /// `1/ARRIVAL_GRAIN` of the limit of the last are merged into it (which dates them a
    /// little earlier, never later), so a client sending a byte at a time makes at most
    /// `ARRIVAL_GRAIN` entries before its oldest byte times out.
    fn arrived(&mut self, now: Instant, frame_read_timeout: Duration) {
        let grain = frame_read_timeout / ARRIVAL_GRAIN;
        match self.arrivals.back_mut() {
            Some((end, at)) if now.saturating_duration_since(*at) < grain => {
                *end = self.buffered_total;
            }
            _ => self.arrivals.push_back((self.buffered_total, now)),
        }
    }

    /// When the oldest byte still buffered arrived; `None` when nothing is buffered.
    pub fn oldest_arrival(&self) -> Option<Instant> {
        self.arrivals.front().map(|&(_, at)| at)
    }

    /// Waits until a byte can be read without consuming it: `Ok(true)` when one is there,
    /// `Ok(false)` when the client closed the connection instead.
    pub async fn wait_for_data(&mut self) -> io::Result<bool> {
        if !self.pending.is_empty() {
            return Ok(true);
        }
        let mut byte = [0u8; 1];
        Ok(self.socket.peek(&mut byte).await? > 0)
    }

    /// Reads and buffers what the client sends until it leaves, holds more than the
    /// request budget allows, or a buffered byte has waited `frame_read_timeout`; returns
    /// which. Never returns while the client stays within those limits. Cancel-safe: bytes
    /// read before a cancellation stay buffered.
    pub async fn until_closed(&mut self, frame_read_timeout: Duration) -> Left {
        loop {
            let readable = self.socket.readable();
            let readable = match self.oldest_arrival() {
                Some(arrived) => tokio::select! {
                    readable = readable => readable,
                    () = tokio::time::sleep_until(arrived + frame_read_timeout) => {
                        return Left::WaitedTooLong(frame_read_timeout);
                    }
                },
                None => readable.await,
            };
            if let Err(e) = readable {
                return Left::Failed(e);
            }
            // The readiness may be left over from the request's own read: most wake-ups
            // read nothing (WouldBlock), and then nothing is allocated.
            let mut chunk = [0u8; READ_CHUNK];
            match self.socket.try_read(&mut chunk) {
                Ok(0) => return Left::Closed,
                Ok(n) => {
                    if let Err(e) = self.budget.hold(n) {
                        return Left::OverBudget(e);
                    }
                    self.pending.extend_from_slice(&chunk[..n]);
                    self.buffered_total += n as u64;
                    self.arrived(Instant::now(), frame_read_timeout);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Left::Failed(e),
            }
        }
    }

    /// Arrival entries kept.
    #[cfg(test)]
    fn arrival_entries(&self) -> usize {
        self.arrivals.len()
    }

    /// Bytes buffered and not yet read.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.pending.len()
    }
}

impl AsyncRead for ClientReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            let before = buf.filled().len();
            let read = Pin::new(&mut this.socket).poll_read(cx, buf);
            let got = buf.filled().len() - before;
            if let Poll::Ready(Ok(())) = read {
                if let Err(e) = this.budget.hold(got) {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::OutOfMemory, e)));
                }
            }
            return read;
        }
        let n = buf.remaining().min(this.pending.len());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        this.taken_total += n as u64;
        while let Some(&(end, _)) = this.arrivals.front() {
            if end > this.taken_total {
                break;
            }
            this.arrivals.pop_front();
        }
        if this.pending.is_empty() {
            this.pending = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::config::OWN_REQUEST_BYTES;
    use crate::broker::request_budget::RequestBudget;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::{timeout, Duration};

    async fn pair() -> (ClientReader, TcpStream) {
        pair_within(usize::MAX).await
    }

    async fn pair_within(budget: usize) -> (ClientReader, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (read, _write) = server.into_split();
        // The write half is dropped: that only shuts the server's sending side.
        let budget = ConnectionBudget::new(Arc::new(RequestBudget::new(budget)), usize::MAX);
        (ClientReader::new(read, budget), client)
    }

    #[tokio::test]
    async fn pipelined_bytes_are_kept_in_order_and_a_close_is_seen() {
        let (mut reader, mut client) = pair().await;
        client.write_all(b"first").await.unwrap();
        // Watch for a little while: the bytes are buffered, not taken as a close.
        let watched = timeout(
            Duration::from_millis(200),
            reader.until_closed(Duration::from_secs(60)),
        )
        .await;
        assert!(watched.is_err(), "a client that sent bytes did not leave");
        assert_eq!(reader.buffered(), 5);
        client.write_all(b" second").await.unwrap();
        assert!(reader.wait_for_data().await.unwrap());
        let mut got = vec![0u8; 12];
        timeout(Duration::from_secs(5), reader.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"first second");
        drop(client);
        let left = timeout(
            Duration::from_secs(5),
            reader.until_closed(Duration::from_secs(60)),
        )
        .await
        .unwrap();
        assert!(matches!(left, Left::Closed), "{left}");
        assert!(!reader.wait_for_data().await.unwrap());
    }

    #[tokio::test]
    async fn a_close_behind_many_pipelined_bytes_is_seen() {
        let (mut reader, mut client) = pair().await;
        client.write_all(&vec![1u8; 3 << 20]).await.unwrap();
        drop(client);
        let left = timeout(
            Duration::from_secs(5),
            reader.until_closed(Duration::from_secs(60)),
        )
        .await
        .unwrap();
        assert!(matches!(left, Left::Closed), "{left}");
        assert_eq!(reader.buffered(), 3 << 20);
    }

    #[tokio::test]
    async fn pipelining_beyond_the_budget_ends_the_watch_and_release_gives_it_back() {
        let (mut reader, mut client) = pair_within(100_000).await;
        let sender = tokio::spawn(async move {
            let _ = client.write_all(&vec![1u8; 1 << 20]).await;
            client
        });
        let left = timeout(
            Duration::from_secs(5),
            reader.until_closed(Duration::from_secs(60)),
        )
        .await
        .unwrap();
        assert!(matches!(left, Left::OverBudget(_)), "{left}");
        assert!(reader.buffered() <= OWN_REQUEST_BYTES + 100_000);
        let held = reader.buffered();
        reader.budget.release(held);
        assert_eq!(reader.budget.held(), 0);
        drop(reader);
        drop(timeout(Duration::from_secs(5), sender).await);
    }

    #[tokio::test]
    async fn bytes_buffered_longer_than_the_frame_read_timeout_end_the_watch() {
        let (mut reader, mut client) = pair().await;
        let limit = Duration::from_millis(300);
        client.write_all(b"early").await.unwrap();
        let started = Instant::now();
        let left = timeout(Duration::from_secs(5), reader.until_closed(limit))
            .await
            .unwrap();
        assert!(matches!(left, Left::WaitedTooLong(_)), "{left}");
        assert!(started.elapsed() >= limit - Duration::from_millis(50));
        // Once read, nothing is old: a watch with nothing buffered never times out.
        let mut got = [0u8; 5];
        reader.read_exact(&mut got).await.unwrap();
        assert_eq!(reader.oldest_arrival(), None);
        let watched = timeout(Duration::from_millis(600), reader.until_closed(limit)).await;
        assert!(watched.is_err(), "nothing was buffered: {watched:?}");
    }

    #[tokio::test]
    async fn a_client_sending_a_byte_at_a_time_makes_few_arrival_entries() {
        let (mut reader, mut client) = pair().await;
        let limit = Duration::from_millis(640);
        let sender = tokio::spawn(async move {
            for _ in 0..300 {
                if client.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            client
        });
        let left = timeout(Duration::from_secs(5), reader.until_closed(limit))
            .await
            .unwrap();
        assert!(matches!(left, Left::WaitedTooLong(_)), "{left}");
        assert!(reader.buffered() > 0);
        assert!(
            reader.arrival_entries() <= ARRIVAL_GRAIN as usize + 1,
            "{} entries for {} bytes",
            reader.arrival_entries(),
            reader.buffered()
        );
        drop(sender.await);
    }
}
