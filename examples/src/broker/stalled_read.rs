//! Reading a request frame while watching for a stall: a connection whose request has
//! started but that sends nothing for [`STALL`] counts as idle for eviction (`admission.rs`)
//! until its next byte is seen, so connections holding a byte of a frame each cannot keep
//! a fresh client out at the connection cap (issue #29, review finding 4) for the whole
//! `--frame-read-timeout-ms`.
//!
//! Invariants:
//! - The frame is read exactly as [`read_frame`] reads it; only the bytes it takes are
//!   counted (a stack counter, nothing allocated). The stall check ticks every [`STALL`]
//!   only while a frame is partly read: a frame read at once registers no timer.
//! - A connection is marked stalled when a tick finds no byte since the previous one (so
//!   within one to two [`STALL`]s of its last byte), busy again at the first tick that finds
//!   one, and busy before its frame is handed on; if it was evicted meanwhile the frame is
//!   never handed on (the connection's eviction watch closes it).
//! - Real clients write a request in one go: on loopback or a LAN a second without a byte
//!   inside a frame is a stalled or hostile sender, and it loses its place only at the
//!   connection cap, under the same order as an idle connection.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};

use super::admission::Slot;
use super::frame::{read_frame, FrameError};

/// How long a started request may send nothing before its connection counts as idle.
pub const STALL: Duration = Duration::from_secs(1);

/// `inner`, counting the bytes read through it.
struct Counting<'a, R> {
    inner: &'a mut R,
    bytes: &'a AtomicU64,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counting<'_, R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut *this.inner).poll_read(cx, buf);
        let got = (buf.filled().len() - before) as u64;
        this.bytes.fetch_add(got, Ordering::Relaxed);
        read
    }
}

/// Reads one frame as [`read_frame`] does, marking `slot` stalled while the frame's bytes
/// stop coming (see the module's invariants). Never resolves if the connection was
/// evicted while stalled: the caller's watch of [`Slot::evicted`] ends it.
pub async fn read_frame_watching_stalls<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
    slot: &Slot,
) -> Result<Option<Bytes>, FrameError> {
    let bytes = AtomicU64::new(0);
    let mut counting = Counting {
        inner: reader,
        bytes: &bytes,
    };
    let frame = read_frame(&mut counting, limit);
    tokio::pin!(frame);
    let mut seen = 0;
    let mut stalled = false;
    loop {
        tokio::select! {
            biased;
            frame = &mut frame => {
                if stalled && !slot.busy() {
                    // Evicted: its permit is waiting in `Slot::evicted`.
                    std::future::pending::<()>().await;
                }
                return frame;
            }
            () = tokio::time::sleep(STALL) => {
                let now = bytes.load(Ordering::Relaxed);
                if now == seen && !stalled {
                    slot.stalled();
                    stalled = true;
                } else if now != seen && stalled {
                    if !slot.busy() {
                        std::future::pending::<()>().await;
                    }
                    stalled = false;
                }
                seen = now;
            }
        }
    }
}
