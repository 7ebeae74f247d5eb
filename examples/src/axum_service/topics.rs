//! The axum service's topics: each one an end offset (the number of records appended)
//! and, per simulated follower, how far that follower has copied it. No record is kept:
//! the service is about waiting for offsets, not storing data.
//!
//! # Invariants
//! - A topic's end offset only grows, by one per append; the append that takes offset
//!   `o` leaves the end at `o + 1`.
//! - A follower's copied offset only grows (`fetch_max`), and never passes the end: a
//!   follower is told of an end only after the append that made it.
//! - Topics are made on first use (a poll or a produce naming them) and never removed,
//!   up to `max_topics`: past that, a new name is refused, so clients cannot grow the
//!   map without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// One topic's offsets.
#[derive(Debug)]
pub struct Topic {
    name: String,
    end: AtomicU64,
    /// Per follower: every offset below this one is copied.
    copied: Box<[AtomicU64]>,
}

impl Topic {
    fn new(name: &str, followers: usize) -> Self {
        Topic {
            name: name.to_owned(),
            end: AtomicU64::new(0),
            copied: (0..followers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The topic's name: the key its long polls and produces are watched on.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The end offset: how many records were appended (the next record's offset).
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Appends one record; returns its offset.
    pub fn append(&self) -> u64 {
        self.end.fetch_add(1, Ordering::AcqRel)
    }

    /// Follower `follower` has copied every offset below `end`.
    pub fn copied_to(&self, follower: usize, end: u64) {
        self.copied[follower].fetch_max(end, Ordering::AcqRel);
    }

    /// How many followers have copied the record at `offset`.
    pub fn copies_of(&self, offset: u64) -> usize {
        self.copied
            .iter()
            .filter(|copied| copied.load(Ordering::Acquire) > offset)
            .count()
    }
}

/// The topics by name.
#[derive(Debug)]
pub struct Topics {
    by_name: RwLock<HashMap<String, Arc<Topic>>>,
    followers: usize,
    max_topics: usize,
}

impl Topics {
    /// No topics yet; each will have `followers` followers; at most `max_topics` of them.
    pub fn new(followers: usize, max_topics: usize) -> Self {
        Topics {
            by_name: RwLock::new(HashMap::new()),
            followers,
            max_topics,
        }
    }

    /// The topic `name`, made now if it is new; `None` if it is new and there are
    /// already `max_topics`.
    pub fn get_or_make(&self, name: &str) -> Option<Arc<Topic>> {
        if let Some(topic) = self.by_name.read().get(name) {
            return Some(Arc::clone(topic));
        }
        let mut by_name = self.by_name.write();
        if let Some(topic) = by_name.get(name) {
            return Some(Arc::clone(topic)); // made meanwhile
        }
        if by_name.len() >= self.max_topics {
            return None;
        }
        let topic = Arc::new(Topic::new(name, self.followers));
        by_name.insert(name.to_owned(), Arc::clone(&topic));
        Some(topic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_copies_count_offsets() {
        let topics = Topics::new(2, 10);
        let topic = topics.get_or_make("t").unwrap();
        assert_eq!((topic.append(), topic.append(), topic.end()), (0, 1, 2));
        topic.copied_to(0, 2);
        topic.copied_to(1, 1);
        topic.copied_to(1, 0); // never goes back
        assert_eq!((topic.copies_of(0), topic.copies_of(1)), (2, 1));
    }

    #[test]
    fn makes_each_name_once_and_no_more_than_the_cap() {
        let topics = Topics::new(0, 2);
        let first = topics.get_or_make("a").unwrap();
        assert!(Arc::ptr_eq(&first, &topics.get_or_make("a").unwrap()));
        assert!(topics.get_or_make("b").is_some());
        assert!(topics.get_or_make("c").is_none());
        assert!(topics.get_or_make("a").is_some());
    }
}
