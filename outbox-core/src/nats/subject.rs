//! Subjects and stream names: an aggregate id as one subject token, a topic as a stream name.

use std::borrow::Cow;

/// The aggregate id as one NATS subject token, reversibly: a byte that a token cannot hold
/// (`.`, `*`, `>`, whitespace, a control character) and `%` itself become `%XX` (upper-case
/// hex), and the empty id becomes `%`. Anything else, UTF-8 included, stays as it is, so the
/// usual ids read the same in a subject.
///
/// ```
/// use outbox_core::nats::subject_token;
/// assert_eq!(subject_token("42"), "42");
/// assert_eq!(subject_token("eu.west 7"), "eu%2Ewest%207");
/// assert_eq!(subject_token("a*b>c%"), "a%2Ab%3Ec%25");
/// assert_eq!(subject_token(""), "%");
/// ```
pub fn subject_token(aggregate_id: &str) -> Cow<'_, str> {
    if aggregate_id.is_empty() {
        return Cow::Borrowed("%");
    }
    if !aggregate_id.bytes().any(escaped) {
        return Cow::Borrowed(aggregate_id);
    }
    let mut token = String::with_capacity(aggregate_id.len() + 8);
    for c in aggregate_id.chars() {
        if c.is_ascii() && escaped(c as u8) {
            token.push_str(&format!("%{:02X}", c as u8));
        } else {
            token.push(c);
        }
    }
    Cow::Owned(token)
}

/// Whether a byte of an aggregate id is escaped in its subject token.
fn escaped(b: u8) -> bool {
    matches!(b, b'.' | b'*' | b'>' | b'%') || b.is_ascii_whitespace() || b.is_ascii_control()
}

/// The aggregate id a [`subject_token`] came from; `None` if `token` is not one.
pub(crate) fn aggregate_id(token: &str) -> Option<String> {
    if token == "%" {
        return Some(String::new());
    }
    let bytes = token.as_bytes();
    let mut id = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = token.get(i + 1..i + 3)?;
            id.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            id.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(id).ok()
}

/// The name of the stream the publisher creates for `topic` where no stream captures its
/// subjects: the topic with each character a stream name cannot hold (`.`, `*`, `>`, `/`,
/// `\`, whitespace) as `_`.
///
/// ```
/// use outbox_core::nats::stream_name;
/// assert_eq!(stream_name("order"), "order");
/// assert_eq!(stream_name("prod.order"), "prod_order");
/// ```
pub fn stream_name(topic: &str) -> String {
    topic
        .chars()
        .map(|c| match c {
            '.' | '*' | '>' | '/' | '\\' => '_',
            c if c.is_whitespace() || c.is_control() => '_',
            c => c,
        })
        .collect()
}

/// The subjects of `topic`'s messages, for a stream or a consumer's filter.
pub(crate) fn wildcard(topic: &str) -> String {
    format!("{topic}.>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_turns_back_into_its_id() {
        for id in [
            "42",
            "",
            "%",
            "%2E",
            "a.b.c",
            "tab\there",
            "new\nline",
            "ünïcødé.ok",
            "*>",
            " ",
        ] {
            let token = subject_token(id);
            assert!(
                !token.is_empty()
                    && !token.contains(['.', '*', '>'])
                    && !token.chars().any(char::is_whitespace),
                "{id:?} -> {token:?}"
            );
            assert_eq!(aggregate_id(&token).as_deref(), Some(id), "{token:?}");
        }
        assert_eq!(aggregate_id("%zz"), None);
        assert_eq!(aggregate_id("%4"), None);
    }
}
