//! Reading a request frame while watching how long it takes: a connection whose request
//! has started but is not whole [`STALL`] later counts as idle for eviction
//! (`admission.rs`) until it is whole, so connections holding a byte of a frame each
//! (issue #29, review finding 4), or trickling their requests a byte at a time (issue #38,
//! finding 6: they kept their place as long as they trickled), cannot keep a fresh
//! client out at the connection cap.
//!
//! Invariants:
//! - The frame is read exactly as [`read_frame`] reads it. The check is one timer, set
//!   only while a frame is partly read: a frame read at once registers none.
//! - A connection is marked stalled when its frame is not whole [`STALL`] after the read
//!   began, whether bytes still come or not, and busy again before its frame is handed
//!   on; if it was evicted meanwhile the frame is never handed on (the connection's
//!   eviction watch closes it).
//! - Real clients write a request in one go: on loopback or a LAN a frame still coming a
//!   second after it began is a stalled, trickling or very large one, and it loses its
//!   place only at the connection cap, under the same order as an idle connection (an
//!   established client's after every stranger's). A large produce over a slow link is
//!   evictable too while it arrives, at the cap only.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncRead;

use super::admission::Slot;
use super::frame::{read_frame, FrameError};

/// How long a started request may take to arrive whole before its connection counts as
/// idle.
pub const STALL: Duration = Duration::from_secs(1);

/// Reads one frame as [`read_frame`] does, marking `slot` stalled once the frame has
/// taken [`STALL`] (see the module's invariants). Never resolves if the connection was
/// evicted while stalled: the caller's watch of [`Slot::evicted`] ends it.
pub async fn read_frame_watching_stalls<R: AsyncRead + Unpin>(
    reader: &mut R,
    limit: usize,
    slot: &Slot,
) -> Result<Option<Bytes>, FrameError> {
    let frame = read_frame(reader, limit);
    tokio::pin!(frame);
    let mut stalled = false;
    let slow = tokio::time::sleep(STALL);
    tokio::pin!(slow);
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
            () = &mut slow, if !stalled => {
                slot.stalled();
                stalled = true;
            }
        }
    }
}
