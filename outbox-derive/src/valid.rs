//! The rules one value must follow, as plain functions from the value to the problem with it
//! (the caller attaches the span).

/// The largest version: versions are stored in a signed 32-bit column.
pub(crate) const MAX_VERSION: u64 = i32::MAX as u64;
/// The longest Kafka topic name.
pub(crate) const MAX_TOPIC_LEN: usize = 249;

/// What a topic name is used for, for messages.
#[derive(Clone, Copy)]
pub(crate) enum TopicKey {
    /// `aggregate`, the default topic.
    Aggregate,
    /// `topic`.
    Topic,
}

/// The rules of a Kafka topic name: `aggregate` (which names the default topic) and `topic`.
pub(crate) fn topic_name(key: TopicKey, value: &str) -> Result<(), String> {
    let (name, why) = match key {
        TopicKey::Aggregate => ("aggregate", " (the aggregate names the default topic)"),
        TopicKey::Topic => ("topic", ""),
    };
    let bad = |c: &char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    Err(if value.is_empty() {
        format!("`{name}` must not be empty")
    } else if value == "." || value == ".." {
        format!("`{name}` cannot be `{value}`, Kafka reserves it{why}")
    } else if let Some(c) = value.chars().find(bad) {
        format!(
            "`{name}` contains {c:?}, which a Kafka topic name cannot contain{why}; \
             use ASCII letters, digits, `.`, `_` or `-`"
        )
    } else if value.len() > MAX_TOPIC_LEN {
        format!(
            "`{name}` is {} characters long, a Kafka topic name has at most {MAX_TOPIC_LEN}{why}",
            value.len()
        )
    } else {
        return Ok(());
    })
}

/// An event type is free text, but not empty, blank, padded or holding control characters.
pub(crate) fn event_type(value: &str) -> Result<(), String> {
    Err(if value.is_empty() {
        "`event_type` must not be empty".to_owned()
    } else if value.trim().is_empty() {
        "`event_type` must not be blank".to_owned()
    } else if value.trim() != value {
        format!(
            "`event_type` must not start or end with whitespace, write `event_type = {:?}`",
            value.trim()
        )
    } else if let Some(c) = value.chars().find(|c| c.is_control()) {
        format!("`event_type` must not contain control characters, found {c:?}")
    } else {
        return Ok(());
    })
}

/// The longest consumer name the inbox stores (a `VARCHAR(255)` on MySQL).
pub(crate) const MAX_CONSUMER_CHARS: usize = 255;

/// A consumer name (`#[idempotent(consumer = "...")]`): what the inbox stores each applied
/// message under, so not empty, padded or holding control characters, and short enough for
/// its column.
pub(crate) fn consumer(value: &str) -> Result<(), String> {
    Err(if value.is_empty() {
        "`consumer` must not be empty".to_owned()
    } else if value.trim() != value {
        "`consumer` must not start or end with whitespace".to_owned()
    } else if value.chars().any(char::is_control) {
        "`consumer` must not contain control characters".to_owned()
    } else if value.chars().count() > MAX_CONSUMER_CHARS {
        format!(
            "`consumer` is {} characters long, the inbox stores at most {MAX_CONSUMER_CHARS}",
            value.chars().count()
        )
    } else {
        return Ok(());
    })
}

/// A version from the digits of an integer literal: from 1 to [`MAX_VERSION`].
pub(crate) fn version(digits: &str) -> Result<u32, String> {
    // Digits that do not fit a u64 are certainly too large.
    match digits.parse::<u64>().unwrap_or(u64::MAX) {
        0 => Err(VERSION_AT_LEAST_1.to_owned()),
        n if n > MAX_VERSION => Err(format!(
            "`version` must be at most {MAX_VERSION} (it is stored as a signed 32-bit integer)"
        )),
        n => Ok(n as u32),
    }
}

/// The message for a version below 1.
pub(crate) const VERSION_AT_LEAST_1: &str = "`version` must be at least 1, versions start at 1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        for ok in ["order", "Orders.v1", "a_b-c", "...", "x", &"t".repeat(249)] {
            assert_eq!(topic_name(TopicKey::Topic, ok), Ok(()), "{ok}");
        }
        let err = |v: &str| topic_name(TopicKey::Topic, v).unwrap_err();
        assert_eq!(err(""), "`topic` must not be empty");
        assert_eq!(err(".."), "`topic` cannot be `..`, Kafka reserves it");
        assert!(err("a b").starts_with("`topic` contains ' ', which"));
        assert!(err("a/b").starts_with("`topic` contains '/', which"));
        assert!(err("ä").starts_with("`topic` contains 'ä', which"));
        assert_eq!(
            err(&"t".repeat(250)),
            "`topic` is 250 characters long, a Kafka topic name has at most 249"
        );
        let aggregate = topic_name(TopicKey::Aggregate, ".").unwrap_err();
        assert!(aggregate.ends_with("(the aggregate names the default topic)"));
    }

    #[test]
    fn event_types() {
        for ok in ["OrderCreated", "order.created.v1", "Commande réglée", "é"] {
            assert_eq!(event_type(ok), Ok(()), "{ok}");
        }
        assert_eq!(
            event_type("").unwrap_err(),
            "`event_type` must not be empty"
        );
        assert_eq!(
            event_type(" \t").unwrap_err(),
            "`event_type` must not be blank"
        );
        assert_eq!(
            event_type("Paid ").unwrap_err(),
            "`event_type` must not start or end with whitespace, write `event_type = \"Paid\"`"
        );
        assert_eq!(
            event_type("A\u{0}B").unwrap_err(),
            "`event_type` must not contain control characters, found '\\0'"
        );
    }

    #[test]
    fn versions() {
        assert_eq!(version("1"), Ok(1));
        assert_eq!(version("2147483647"), Ok(2_147_483_647));
        assert_eq!(version("0").unwrap_err(), VERSION_AT_LEAST_1);
        assert!(version("2147483648").is_err());
        assert!(version("4294967296").is_err());
        assert!(version("99999999999999999999999999").is_err());
    }
}
