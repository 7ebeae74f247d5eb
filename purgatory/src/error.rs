//! Errors of the purgatory's public API. Every error that refuses an operation gives it
//! back, so the caller can still answer its request.

use std::fmt;

/// Why `try_complete_else_watch` / `watch` refused an operation (which it hands back).
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
        match self {
            WatchError::NoKeys(op)
            | WatchError::Shutdown(op)
            | WatchError::KeyPanicked(op)
            | WatchError::TimeoutPanicked(op) => op,
        }
    }
}

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
        match self {
            WatchError::NoKeys(_) => {
                f.write_str("an operation must be watched on at least one key")
            }
            WatchError::Shutdown(_) => f.write_str("the purgatory has been shut down"),
            WatchError::KeyPanicked(_) => {
                f.write_str("a key's Hash or Eq panicked while the operation was watched")
            }
            WatchError::TimeoutPanicked(_) => f.write_str("the operation's timeout() panicked"),
        }
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
