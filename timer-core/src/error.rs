//! Errors of the timer's public API.

use std::fmt;

/// Why a timer could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// The tick must be between 1 microsecond and 1 hour.
    InvalidTick(std::time::Duration),
    /// The wheel size must be between 2 and 65,536 buckets.
    InvalidWheelSize(u32),
    /// The shard count must be between 1 and 1,024.
    InvalidShards(usize),
    /// The limit of stand-ins must be between 1 and 1,024
    /// ([`TimerBuilder::max_stand_ins`](crate::TimerBuilder::max_stand_ins)).
    InvalidStandIns(usize),
    /// The stand-in bound must be at least 1 millisecond
    /// ([`TimerBuilder::stand_in`](crate::TimerBuilder::stand_in)): below that the
    /// watchdog would look thousands of times a second.
    InvalidStandInBound(std::time::Duration),
    /// The reaper thread could not be spawned.
    Spawn(std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::InvalidTick(tick) => {
                write!(f, "tick {tick:?} is out of range (1us ..= 1h)")
            }
            BuildError::InvalidWheelSize(size) => {
                write!(f, "wheel size {size} is out of range (2 ..= 65536)")
            }
            BuildError::InvalidShards(n) => {
                write!(f, "shard count {n} is out of range (1 ..= 1024)")
            }
            BuildError::InvalidStandIns(n) => {
                write!(f, "stand-in limit {n} is out of range (1 ..= 1024)")
            }
            BuildError::InvalidStandInBound(bound) => {
                write!(f, "stand-in bound {bound:?} is below 1 ms")
            }
            BuildError::Spawn(e) => write!(f, "could not spawn the reaper thread: {e}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

/// A task the timer did not accept, handed back to the caller.
#[derive(PartialEq, Eq)]
#[non_exhaustive]
pub enum AddError<T> {
    /// The timer has been shut down.
    Shutdown(T),
}

impl<T> AddError<T> {
    /// The task that was not added.
    pub fn into_task(self) -> T {
        match self {
            AddError::Shutdown(task) => task,
        }
    }
}

impl<T> fmt::Debug for AddError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Shutdown(_) => f.write_str("AddError::Shutdown(..)"),
        }
    }
}

impl<T> fmt::Display for AddError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddError::Shutdown(_) => f.write_str("the timer has been shut down"),
        }
    }
}

impl<T> std::error::Error for AddError<T> {}
