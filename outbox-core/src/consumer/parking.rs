//! Parking: once a message is dead-lettered, later messages of its key (same source, same
//! key) are not applied out of order but follow it to the dead letters.
//!
//! Parked keys live in this process's memory: a restarted consumer forgets them, and applies
//! the later messages of a key it no longer remembers. The dead-letter topic is the record
//! (every parked message carries the coordinates of the dead letter it waits behind), and
//! replaying the dead letters in their order applies the key's messages in order again.

use std::collections::{HashMap, VecDeque};

use super::received::{Received, coordinates};
use crate::HEADER_ID;

/// What a key is parked behind: the first of its messages that was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) source: String,
    pub(crate) partition: Option<i32>,
    pub(crate) position: i64,
    /// Its event id (the `id` header), if it had one.
    pub(crate) id: Option<String>,
}

impl Head {
    /// `topic/partition/offset`, the value of the `outbox.parked.behind` header.
    pub(crate) fn coordinates(&self) -> String {
        coordinates(&self.source, self.partition, self.position)
    }
}

/// The parked keys, at most `max` of them (the oldest is forgotten first, with an error log).
pub(crate) struct Parking {
    heads: HashMap<(String, Vec<u8>), Head>,
    order: VecDeque<(String, Vec<u8>)>,
    max: usize,
}

impl Parking {
    pub(crate) fn new(max: usize) -> Self {
        Parking {
            heads: HashMap::new(),
            order: VecDeque::new(),
            max,
        }
    }

    /// The dead letter `message`'s key is parked behind, if it is.
    pub(crate) fn head_of(&self, message: &impl Received) -> Option<Head> {
        let key = message.key()?;
        self.heads
            .get(&(message.source().to_owned(), key.to_vec()))
            .cloned()
    }

    /// Parks `message`'s key behind it (a message without a key parks nothing). Returns the
    /// key forgotten to make room, if one was.
    pub(crate) fn park(&mut self, message: &impl Received) -> Option<(String, Vec<u8>)> {
        let key = (message.source().to_owned(), message.key()?.to_vec());
        if self.heads.contains_key(&key) || self.max == 0 {
            return None;
        }
        let id = message
            .header(HEADER_ID)
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let head = Head {
            source: message.source().to_owned(),
            partition: message.partition(),
            position: message.position(),
            id,
        };
        self.heads.insert(key.clone(), head);
        self.order.push_back(key);
        if self.order.len() > self.max {
            let oldest = self.order.pop_front()?;
            self.heads.remove(&oldest);
            return Some(oldest);
        }
        None
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heads.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::received::TestMessage;

    fn message(topic: &str, key: Option<&str>, offset: i64) -> TestMessage {
        TestMessage {
            source: topic.into(),
            partition: Some(1),
            position: offset,
            key: key.map(|k| k.as_bytes().to_vec()),
            payload: None,
            headers: vec![("id".into(), Some(b"e-1".to_vec()))],
        }
    }

    #[test]
    fn a_key_is_parked_behind_its_first_dead_letter_per_topic() {
        let mut parking = Parking::new(10);
        assert_eq!(parking.park(&message("order", Some("7"), 3)), None);
        assert_eq!(parking.park(&message("order", Some("7"), 9)), None);
        let head = parking.head_of(&message("order", Some("7"), 12)).unwrap();
        assert_eq!(head.coordinates(), "order/1/3");
        assert_eq!(head.id.as_deref(), Some("e-1"));
        assert_eq!(parking.head_of(&message("order", Some("8"), 12)), None);
        assert_eq!(parking.head_of(&message("payment", Some("7"), 12)), None);
        // No key, no order to keep.
        assert_eq!(parking.park(&message("order", None, 13)), None);
        assert_eq!(parking.head_of(&message("order", None, 14)), None);
        assert_eq!(parking.len(), 1);
    }

    #[test]
    fn the_oldest_key_is_forgotten_beyond_the_bound() {
        let mut parking = Parking::new(2);
        parking.park(&message("t", Some("a"), 1));
        parking.park(&message("t", Some("b"), 2));
        let forgotten = parking.park(&message("t", Some("c"), 3));
        assert_eq!(forgotten, Some(("t".to_owned(), b"a".to_vec())));
        assert_eq!(parking.len(), 2);
        assert!(parking.head_of(&message("t", Some("a"), 4)).is_none());
        assert!(parking.head_of(&message("t", Some("c"), 4)).is_some());
    }
}
