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
//!   request budget instead: every byte read from the socket is counted in the
//!   connection's [`ConnectionBudget`] until [`release`](ClientReader::release)d (once the
//!   request it belongs to is handled); a read the budget refuses ends the watch with
//!   [`Left::OverBudget`] (or fails the frame read), and the connection is closed.
//! - An idle or waiting connection holds no buffer: it is allocated when bytes arrive
//!   during a wait and released once read.
//!
//! [`until_closed`]: ClientReader::until_closed

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

use super::request_budget::{ConnectionBudget, OverBudget};

/// Bytes read at most per read while a request waits (into a buffer on the stack, so a
/// waiting connection that receives nothing allocates nothing).
const READ_CHUNK: usize = 16 * 1024;

/// How a client left.
#[derive(Debug)]
pub enum Left {
    /// End of stream: the client closed (or shut down its sending side).
    Closed,
    /// The socket failed (typically a reset).
    Failed(io::Error),
    /// It pipelined more than the request budget lets it hold.
    OverBudget(OverBudget),
}

impl fmt::Display for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Left::Closed => write!(f, "the client closed the connection"),
            Left::Failed(e) => write!(f, "socket error: {e}"),
            Left::OverBudget(e) => write!(f, "pipelined {e}"),
        }
    }
}

/// The read half of a client connection with what the client pipelined during a wait.
pub struct ClientReader {
    socket: OwnedReadHalf,
    pending: BytesMut,
    budget: ConnectionBudget,
}

impl ClientReader {
    /// Reads from `socket`, counting what it holds in `budget`.
    pub fn new(socket: OwnedReadHalf, budget: ConnectionBudget) -> Self {
        ClientReader {
            socket,
            pending: BytesMut::new(),
            budget,
        }
    }

    /// The request of `bytes` bytes (its size field included) was handed to its handler:
    /// they are no longer held as queued.
    pub fn release(&mut self, bytes: usize) {
        self.budget.release(bytes);
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

    /// Reads and buffers what the client sends until it leaves or holds more than the
    /// request budget allows; returns which. Never returns while the client stays within
    /// the budget. Cancel-safe: bytes read before a cancellation stay buffered.
    pub async fn until_closed(&mut self) -> Left {
        loop {
            if let Err(e) = self.socket.readable().await {
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
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Left::Failed(e),
            }
        }
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
        let budget = ConnectionBudget::new(Arc::new(RequestBudget::new(budget)));
        (ClientReader::new(read, budget), client)
    }

    #[tokio::test]
    async fn pipelined_bytes_are_kept_in_order_and_a_close_is_seen() {
        let (mut reader, mut client) = pair().await;
        client.write_all(b"first").await.unwrap();
        // Watch for a little while: the bytes are buffered, not taken as a close.
        let watched = timeout(Duration::from_millis(200), reader.until_closed()).await;
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
        let left = timeout(Duration::from_secs(5), reader.until_closed())
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
        let left = timeout(Duration::from_secs(5), reader.until_closed())
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
        let left = timeout(Duration::from_secs(5), reader.until_closed())
            .await
            .unwrap();
        assert!(matches!(left, Left::OverBudget(_)), "{left}");
        assert!(reader.buffered() <= OWN_REQUEST_BYTES + 100_000);
        let held = reader.buffered();
        reader.release(held);
        assert_eq!(reader.budget.held(), 0);
        drop(reader);
        drop(timeout(Duration::from_secs(5), sender).await);
    }
}
