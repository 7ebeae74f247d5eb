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
//! - The buffer holds at most [`PIPELINE_LIMIT`] bytes; past it the socket is not read until
//!   the waiting request is answered (back-pressure, as before this watch existed), and a
//!   client leaving in that state is seen only then.
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

/// Most bytes buffered while a request waits.
pub const PIPELINE_LIMIT: usize = 1 << 20;

/// Bytes read at most per read while a request waits (into a buffer on the stack, so a
/// waiting connection that receives nothing allocates nothing).
const READ_CHUNK: usize = 1024;

/// How a client left.
#[derive(Debug)]
pub enum Left {
    /// End of stream: the client closed (or shut down its sending side).
    Closed,
    /// The socket failed (typically a reset).
    Failed(io::Error),
}

impl fmt::Display for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Left::Closed => write!(f, "the client closed the connection"),
            Left::Failed(e) => write!(f, "socket error: {e}"),
        }
    }
}

/// The read half of a client connection with what the client pipelined during a wait.
pub struct ClientReader {
    socket: OwnedReadHalf,
    pending: BytesMut,
}

impl ClientReader {
    /// Reads from `socket`.
    pub fn new(socket: OwnedReadHalf) -> Self {
        ClientReader {
            socket,
            pending: BytesMut::new(),
        }
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

    /// Reads and buffers what the client sends until it leaves; returns how it left. Never
    /// returns while the client stays (it stops reading at [`PIPELINE_LIMIT`] buffered
    /// bytes). Cancel-safe: bytes read before a cancellation stay buffered.
    pub async fn until_closed(&mut self) -> Left {
        loop {
            if self.pending.len() >= PIPELINE_LIMIT {
                return std::future::pending().await;
            }
            if let Err(e) = self.socket.readable().await {
                return Left::Failed(e);
            }
            // The readiness may be left over from the request's own read: most wake-ups
            // read nothing (WouldBlock), and then nothing is allocated.
            let mut chunk = [0u8; READ_CHUNK];
            match self.socket.try_read(&mut chunk) {
                Ok(0) => return Left::Closed,
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
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
            return Pin::new(&mut this.socket).poll_read(cx, buf);
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::{timeout, Duration};

    async fn pair() -> (ClientReader, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (read, _write) = server.into_split();
        // The write half is dropped: that only shuts the server's sending side.
        (ClientReader::new(read), client)
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
}
