//! Kafka's framing: every request and response is a big-endian `i32` size, then that many
//! bytes.
//!
//! Invariants: a frame is never larger than the configured limit (a larger or negative size
//! is an error before anything is allocated), and the buffer grows only as bytes actually
//! arrive (a client announcing 100 MiB and sending nothing holds one small buffer).

use std::fmt;
use std::io;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bytes read at most per read call while a frame arrives.
const READ_CHUNK: usize = 64 * 1024;

/// Why a connection's byte stream cannot go on.
#[derive(Debug)]
pub enum FrameError {
    /// The announced size is negative or above the limit.
    BadSize {
        /// The announced size.
        size: i32,
        /// The limit.
        limit: usize,
    },
    /// The peer closed the connection in the middle of a frame.
    Truncated,
    /// The socket failed.
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadSize { size, limit } => {
                write!(f, "frame size {size} outside 0..={limit}")
            }
            FrameError::Truncated => write!(f, "connection closed inside a frame"),
            // The request budget refused the bytes (`client_socket.rs`).
            FrameError::Io(e) if e.kind() == io::ErrorKind::OutOfMemory => write!(f, "{e}"),
            FrameError::Io(e) => write!(f, "socket error: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Reads one frame. `Ok(None)` when the peer closed the connection between frames.
pub async fn read_frame<R>(reader: &mut R, limit: usize) -> Result<Option<Bytes>, FrameError>
where
    R: AsyncRead + Unpin,
{
    let mut size = [0u8; 4];
    let mut got = 0;
    while got < size.len() {
        match reader
            .read(&mut size[got..])
            .await
            .map_err(FrameError::Io)?
        {
            0 if got == 0 => return Ok(None),
            0 => return Err(FrameError::Truncated),
            n => got += n,
        }
    }
    let announced = i32::from_be_bytes(size);
    let len = usize::try_from(announced)
        .ok()
        .filter(|&len| len <= limit)
        .ok_or(FrameError::BadSize {
            size: announced,
            limit,
        })?;
    let mut frame = BytesMut::with_capacity(len.min(READ_CHUNK));
    while frame.len() < len {
        let want = (len - frame.len()).min(READ_CHUNK);
        frame.reserve(want);
        let n = (&mut *reader)
            .take(want as u64)
            .read_buf(&mut frame)
            .await
            .map_err(FrameError::Io)?;
        if n == 0 {
            return Err(FrameError::Truncated);
        }
    }
    Ok(Some(frame.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(payload);
        out
    }

    async fn read_all(input: Vec<u8>, limit: usize) -> Vec<Result<Option<Bytes>, String>> {
        let mut reader = input.as_slice();
        let mut out = Vec::new();
        loop {
            let next = read_frame(&mut reader, limit)
                .await
                .map_err(|e| e.to_string());
            let stop = !matches!(next, Ok(Some(_)));
            out.push(next);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn reads_frames_back_to_back_then_a_clean_end() {
        let mut input = framed(b"hello");
        input.extend(framed(b""));
        input.extend(framed(&[7u8; 100_000]));
        let frames = read_all(input, 1 << 20).await;
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[0].as_ref().unwrap().as_deref(), Some(&b"hello"[..]));
        assert_eq!(frames[1].as_ref().unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(frames[2].as_ref().unwrap().as_ref().unwrap().len(), 100_000);
        assert!(matches!(frames[3], Ok(None)));
    }

    #[tokio::test]
    async fn refuses_oversize_and_negative_sizes_and_truncation() {
        let oversize = read_all(framed(&[0u8; 11]), 10).await;
        assert!(oversize[0].as_ref().unwrap_err().contains("outside"));
        let negative = read_all((-1i32).to_be_bytes().to_vec(), 10).await;
        assert!(negative[0].as_ref().unwrap_err().contains("outside"));
        let mut cut = framed(b"abcdef");
        cut.truncate(7);
        let truncated = read_all(cut, 10).await;
        assert!(truncated[0]
            .as_ref()
            .unwrap_err()
            .contains("inside a frame"));
        let half_size = read_all(vec![0u8, 0], 10).await;
        assert!(half_size[0]
            .as_ref()
            .unwrap_err()
            .contains("inside a frame"));
    }
}
