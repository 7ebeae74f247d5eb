//! Errors of the purgatory's public API. Every error that refuses an operation gives it
//! back, so the caller can still answer its request.

use std::fmt;

/// Why `try_complete_else_watch` / `watch` refused an operation (which it hands back).
///
/// # Into `anyhow` and other boxed errors
/// The error holds the refused operation, whose request still waits for an answer, so
/// take the operation back before the error travels on:
/// [`into_parts`](Self::into_parts) splits it into the operation and a
/// [`WatchErrorKind`], a small `Copy` error that is `Send + Sync + 'static` and so goes
/// into `anyhow::Error` or `Box<dyn Error + Send + Sync>` with `?`.
///
/// `WatchError<O>` itself is `Send` and `Sync` only as `O` is. A [`DelayedOperation`]
/// must be `Send` but need not be `Sync`, so `?` straight into `anyhow::Error` compiles
/// only for operations that happen to be `Sync`, and would then carry the operation off
/// inside the error, its request never answered.
///
/// ```
/// use std::sync::mpsc;
/// use std::time::Duration;
/// use purgatory::{Completion, DelayedOperation, Purgatory, WatchErrorKind};
///
/// struct Fetch { reply: mpsc::Sender<String> }
/// impl DelayedOperation for Fetch {
///     fn timeout(&self) -> Duration { Duration::from_secs(30) }
///     fn try_complete(&mut self) -> bool { false }
///     fn on_complete(&mut self, how: Completion) {
///         let _ = self.reply.send(format!("{how:?}"));
///     }
/// }
///
/// fn park(fetches: &Purgatory<u32, Fetch>, fetch: Fetch) -> anyhow::Result<()> {
///     fetches.try_complete_else_watch(fetch, [7]).map_err(|refused| {
///         let (fetch, kind) = refused.into_parts();
///         let _ = fetch.reply.send(format!("refused: {kind}")); // the request is answered
///         kind
///     })?;
///     Ok(())
/// }
///
/// let fetches: Purgatory<u32, Fetch> = Purgatory::new("fetch");
/// fetches.shutdown();
/// let (reply, answers) = mpsc::channel();
/// let error = park(&fetches, Fetch { reply }).unwrap_err();
/// assert_eq!(error.downcast_ref(), Some(&WatchErrorKind::Shutdown));
/// assert_eq!(answers.recv().unwrap(), "refused: the purgatory has been shut down");
/// ```
///
/// [`DelayedOperation`]: crate::DelayedOperation
#[must_use = "it holds the refused operation, whose request still needs an answer"]
#[non_exhaustive]
pub enum WatchError<O> {
    /// The key list was empty: an operation nobody can wake would only ever expire.
    NoKeys(O),
    /// The purgatory has been shut down.
    Shutdown(O),
    /// A key's `Hash` or `Eq` panicked while the operation was being listed (caught and
    /// reported; nothing of the operation stays listed or armed).
    KeyPanicked(O),
    /// The operation's `timeout()` panicked (caught and reported).
    TimeoutPanicked(O),
}

impl<O> WatchError<O> {
    /// The refused operation.
    pub fn into_operation(self) -> O {
        self.into_parts().0
    }

    /// Why the operation was refused, without it.
    pub fn kind(&self) -> WatchErrorKind {
        match self {
            WatchError::NoKeys(_) => WatchErrorKind::NoKeys,
            WatchError::Shutdown(_) => WatchErrorKind::Shutdown,
            WatchError::KeyPanicked(_) => WatchErrorKind::KeyPanicked,
            WatchError::TimeoutPanicked(_) => WatchErrorKind::TimeoutPanicked,
        }
    }

    /// The refused operation and why it was refused: the operation to answer, the
    /// reason to pass on (with `?`, into `anyhow::Error` and the like).
    pub fn into_parts(self) -> (O, WatchErrorKind) {
        let kind = self.kind();
        match self {
            WatchError::NoKeys(op)
            | WatchError::Shutdown(op)
            | WatchError::KeyPanicked(op)
            | WatchError::TimeoutPanicked(op) => (op, kind),
        }
    }

    /// The error of `kind` refusing `op`: [`into_parts`](Self::into_parts) undone.
    pub(crate) fn from_parts(op: O, kind: WatchErrorKind) -> Self {
        match kind {
            WatchErrorKind::NoKeys => WatchError::NoKeys(op),
            WatchErrorKind::Shutdown => WatchError::Shutdown(op),
            WatchErrorKind::KeyPanicked => WatchError::KeyPanicked(op),
            WatchErrorKind::TimeoutPanicked => WatchError::TimeoutPanicked(op),
        }
    }
}

/// Why a watch was refused, without the operation: what [`WatchError::kind`] and
/// [`WatchError::into_parts`] give. A plain `Copy` value and an error of its own
/// (`Send + Sync + 'static`), with the same message as the [`WatchError`] it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WatchErrorKind {
    /// The key list was empty ([`WatchError::NoKeys`]).
    NoKeys,
    /// The purgatory has been shut down ([`WatchError::Shutdown`]).
    Shutdown,
    /// A key's `Hash` or `Eq` panicked ([`WatchError::KeyPanicked`]).
    KeyPanicked,
    /// The operation's `timeout()` panicked ([`WatchError::TimeoutPanicked`]).
    TimeoutPanicked,
}

impl fmt::Display for WatchErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WatchErrorKind::NoKeys => "an operation must be watched on at least one key",
            WatchErrorKind::Shutdown => "the purgatory has been shut down",
            WatchErrorKind::KeyPanicked => {
                "a key's Hash or Eq panicked while the operation was watched"
            }
            WatchErrorKind::TimeoutPanicked => "the operation's timeout() panicked",
        })
    }
}

impl std::error::Error for WatchErrorKind {}

impl<O> fmt::Debug for WatchError<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::NoKeys(_) => f.write_str("WatchError::NoKeys(..)"),
            WatchError::Shutdown(_) => f.write_str("WatchError::Shutdown(..)"),
            WatchError::KeyPanicked(_) => f.write_str("WatchError::KeyPanicked(..)"),
            WatchError::TimeoutPanicked(_) => f.write_str("WatchError::TimeoutPanicked(..)"),
        }
    }
}

impl<O> fmt::Display for WatchError<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.kind(), f)
    }
}

impl<O> std::error::Error for WatchError<O> {}

/// Why a purgatory could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The timer's configuration was rejected.
    Timer(timer_core::BuildError),
    /// The watcher shard count must be between 1 and 65,536.
    InvalidShards(usize),
    /// The purge interval must be at least 1.
    InvalidPurgeInterval,
    /// The reaper thread could not be spawned.
    Spawn(std::io::Error),
    /// Following tokio's time (`PurgatoryBuilder::follow_tokio_time`, feature `tokio`)
    /// was asked for, but `build` ran outside a tokio runtime and no runtime was named,
    /// or the runtime has no time driver (built without `enable_time`).
    NoRuntime,
    /// A [`TimerGroup`](crate::TimerGroup) takes 1 ..= 1,024 purgatories.
    InvalidMaxMembers(usize),
    /// The [`TimerGroup`](crate::TimerGroup) already holds as many purgatories as it
    /// takes (its `max_members`).
    GroupFull(usize),
    /// The [`TimerGroup`](crate::TimerGroup) has been shut down.
    GroupShutDown,
    /// A purgatory built on a [`TimerGroup`](crate::TimerGroup) uses the group's timer:
    /// set `timer` on the group's builder, not the purgatory's. A group cannot follow
    /// tokio's time (`follow_tokio_time`): its reaper is a thread.
    TimerOnGroup,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Timer(e) => write!(f, "invalid timer configuration: {e}"),
            BuildError::InvalidShards(n) => {
                write!(f, "watcher shard count {n} is out of range (1 ..= 65536)")
            }
            BuildError::InvalidPurgeInterval => {
                f.write_str("the purge interval must be at least 1")
            }
            BuildError::Spawn(e) => write!(f, "could not spawn the reaper thread: {e}"),
            BuildError::NoRuntime => {
                f.write_str("following tokio's time needs a runtime with its time driver enabled")
            }
            BuildError::InvalidMaxMembers(n) => {
                write!(
                    f,
                    "a timer group's max_members {n} is out of range (1 ..= 1024)"
                )
            }
            BuildError::GroupFull(n) => {
                write!(f, "the timer group already holds its {n} purgatories")
            }
            BuildError::GroupShutDown => f.write_str("the timer group has been shut down"),
            BuildError::TimerOnGroup => f.write_str(
                "a purgatory on a timer group uses the group's timer: set `timer` on the group's builder (a group cannot follow tokio's time)",
            ),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Timer(e) => Some(e),
            BuildError::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

impl From<timer_core::BuildError> for BuildError {
    fn from(e: timer_core::BuildError) -> Self {
        BuildError::Timer(e)
    }
}
