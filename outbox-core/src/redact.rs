//! Keeping secrets out of messages: which setting names hold secrets ([`is_secret_key`]) and
//! a database URL or connection string with its passwords hidden ([`url`]).
//!
//! Every error, log line and `Debug` output of the library and the `outbox` CLI that shows a
//! database URL or a Kafka setting goes through these two functions, so that one rule decides
//! what is hidden.

use std::borrow::Cow;

/// What replaces a hidden value.
pub const REDACTED: &str = "***";

/// Parts of a setting's name that mark its value as a secret (compared in lower case).
const SECRET_MARKERS: [&str; 9] = [
    "password",
    "passwd",
    "pwd",
    "secret",
    "sasl.",
    "ssl.key",
    "token",
    "credential",
    "jaas",
];

/// Whether a setting named `key` may hold a secret: its name contains `password`, `secret`,
/// `sasl.`, `ssl.key`, `token`, `credential` or `jaas` (any case). Such values are never
/// shown, in errors, logs or `Debug` output.
///
/// ```
/// use outbox_core::redact::is_secret_key;
/// assert!(is_secret_key("sasl.password"));
/// assert!(is_secret_key("ssl.key.password"));
/// assert!(is_secret_key("sasl.oauthbearer.client.secret"));
/// assert!(!is_secret_key("linger.ms"));
/// assert!(!is_secret_key("ssl.ca.location"));
/// ```
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_MARKERS.iter().any(|m| key.contains(m))
}

/// `url` with every password hidden: the `user:password@` part of a URL keeps its user, a
/// query parameter whose name [holds a secret](is_secret_key) (`?password=…`,
/// `?sslpassword=…`) keeps its name, and so does a libpq keyword string's `password=…`.
/// Anything else is returned unchanged.
///
/// ```
/// use outbox_core::redact::url;
/// assert_eq!(url("postgres://app:s3cret@db/app"), "postgres://app:***@db/app");
/// assert_eq!(
///     url("mysql://root@db/app?password=s3cret&ssl-mode=required"),
///     "mysql://root@db/app?password=***&ssl-mode=required"
/// );
/// assert_eq!(url("host=db password=s3cret"), "host=db password=***");
/// assert_eq!(url("/var/lib/app/outbox.db"), "/var/lib/app/outbox.db");
/// ```
pub fn url(url: &str) -> Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return keywords(url);
    };
    // The user info ends at the last `@` not preceded by a query's `=` (a password may
    // hold `@`, `/` or `?`), else at the last `@` before the query.
    let first_q = rest.find('?').unwrap_or(rest.len());
    let at = rest
        .rfind('@')
        .filter(|&at| !rest[..at].contains('='))
        .or_else(|| rest[..first_q].rfind('@'));
    let search_from = at.map_or(0, |at| at + 1);
    let (before_query, query) = match rest[search_from..].find('?') {
        Some(q) => rest.split_at(search_from + q),
        None => (rest, ""),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    out.push_str("://");
    match at {
        Some(at) => {
            let (userinfo, host) = before_query.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push(':');
                    out.push_str(REDACTED);
                }
                None => out.push_str(userinfo),
            }
            out.push_str(host);
        }
        None => out.push_str(before_query),
    }
    if let Some(query) = query.strip_prefix('?') {
        out.push('?');
        let (query, fragment) = match query.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (query, None),
        };
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if is_secret_key(k) => format!("{k}={REDACTED}"),
                _ => p.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
        if let Some(f) = fragment {
            out.push('#');
            out.push_str(f);
        }
    }
    if out == url {
        Cow::Borrowed(url)
    } else {
        Cow::Owned(out)
    }
}

/// A comma-separated list of URLs (a NATS server list, say), each as [`url`] shows it.
///
/// ```
/// use outbox_core::redact::urls;
/// assert_eq!(
///     urls("nats://a:s3cret@n1:4222, nats://n2:4222"),
///     "nats://a:***@n1:4222,nats://n2:4222"
/// );
/// ```
pub fn urls(list: &str) -> String {
    list.split(',')
        .map(|one| url(one.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A libpq keyword string (`host=db password=x`) with secret keywords' values hidden, quoted
/// values (`password='a b'`) included.
fn keywords(s: &str) -> Cow<'_, str> {
    if !s.contains('=') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    let mut changed = false;
    while !rest.is_empty() {
        let ws = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..ws]);
        rest = &rest[ws..];
        let Some(eq) = rest.find('=') else {
            out.push_str(rest);
            break;
        };
        let key = rest[..eq].trim_end();
        if key.contains(char::is_whitespace) {
            // Not `key=value`: copy the word and go on.
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        let after = rest[eq + 1..].trim_start();
        let value_len = value_len(after);
        let secret = is_secret_key(key);
        out.push_str(key);
        out.push('=');
        if secret {
            out.push_str(REDACTED);
            changed = true;
        } else {
            out.push_str(&after[..value_len]);
        }
        rest = &after[value_len..];
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(s)
    }
}

/// The length of a libpq keyword value at the start of `s`: a quoted one with its quotes
/// (`\'` escapes a quote), else up to the next whitespace.
fn value_len(s: &str) -> usize {
    if let Some(inner) = s.strip_prefix('\'') {
        let mut escaped = false;
        for (i, c) in inner.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '\'' => return i + 2,
                _ => {}
            }
        }
        s.len()
    } else {
        s.find(char::is_whitespace).unwrap_or(s.len())
    }
}

#[cfg(feature = "kafka")]
/// `text` with each non-empty one of `values` replaced by [`REDACTED`]: for messages of other
/// libraries (librdkafka's) that may quote a value. A value shorter than
/// [`WHOLE_BELOW`] characters is replaced only where it stands whole, not inside a longer word:
/// a one-letter `sasl.username` must not turn "authentication" into "a***thentication"
/// (librdkafka quotes or delimits the values it names); a longer one everywhere.
pub(crate) fn scrub<'a>(text: &str, values: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_owned();
    for v in values {
        if !v.is_empty() && out.contains(v) {
            out = scrub_one(&out, v);
        }
    }
    out
}

/// Values shorter than this (in characters) are hidden only where they stand whole.
#[cfg(feature = "kafka")]
const WHOLE_BELOW: usize = 8;

/// [`scrub`] of one non-empty value.
#[cfg(feature = "kafka")]
fn scrub_one(text: &str, value: &str) -> String {
    if value.chars().count() >= WHOLE_BELOW {
        return text.replace(value, REDACTED);
    }
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let (first, last) = (value.chars().next(), value.chars().next_back());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(value) {
        let before = rest[..i]
            .chars()
            .next_back()
            .or_else(|| out.chars().next_back());
        let after = rest[i + value.len()..].chars().next();
        let inside = (word(before) && word(first)) || (word(after) && word(last));
        if inside {
            // Not this one: keep its first character and look again from the next.
            let step = i + first.map_or(1, char::len_utf8);
            out.push_str(&rest[..step]);
            rest = &rest[step..];
        } else {
            out.push_str(&rest[..i]);
            out.push_str(REDACTED);
            rest = &rest[i + value.len()..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_user_info_passwords() {
        assert_eq!(url("postgres://u:p@h:5432/d"), "postgres://u:***@h:5432/d");
        // A password holding `@`, `/` and `?` is hidden whole.
        assert_eq!(url("postgres://u:p@/?x@h/d"), "postgres://u:***@h/d");
        assert_eq!(url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(url("postgres://h/d"), "postgres://h/d");
        assert_eq!(
            url("postgres://h/d?options=a@b&password=p"),
            "postgres://h/d?options=a@b&password=***"
        );
    }

    #[test]
    fn redact_url_hides_secret_query_parameters() {
        assert_eq!(
            url("postgres://h/d?sslmode=require&password=p&sslpassword=q#frag"),
            "postgres://h/d?sslmode=require&password=***&sslpassword=***#frag"
        );
        assert_eq!(
            url("postgres://u:p@h/d?password=x"),
            "postgres://u:***@h/d?password=***"
        );
    }

    #[test]
    fn redact_url_hides_keyword_string_passwords() {
        assert_eq!(
            url("host=h user=u password=p dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            url("host=h password = 'a \\' b' dbname=d"),
            "host=h password=*** dbname=d"
        );
        assert_eq!(url("outbox.db"), "outbox.db");
    }

    #[test]
    fn secret_keys() {
        for k in [
            "sasl.password",
            "SASL.USERNAME",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.jaas.config",
            "sasl.oauthbearer.token.endpoint.url",
            "aws.credentials",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["linger.ms", "bootstrap.servers", "ssl.ca.location", "acks"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn scrub_replaces_values() {
        assert_eq!(
            scrub("Invalid value \"hunter2\" for x", ["hunter2"]),
            "Invalid value \"***\" for x"
        );
        assert_eq!(scrub("nothing", [""]), "nothing");
        // Whole values only: a short user name does not eat into words.
        assert_eq!(
            scrub("SASL authentication failed for user u: bad u", ["u"]),
            "SASL authentication failed for user ***: bad ***"
        );
        assert_eq!(
            scrub("mechanisms PLAIN,SCRAM-SHA-512; PLAINTEXT", ["PLAIN"]),
            "mechanisms ***,SCRAM-SHA-512; PLAINTEXT"
        );
        assert_eq!(scrub("`-x-`x-`", ["-x-"]), "`***`x-`");
        assert_eq!(scrub("usvc svcx svc", ["svc"]), "usvc svcx ***");
        // Longer values everywhere.
        assert_eq!(scrub("x=ahunter2-secretb", ["hunter2-secret"]), "x=a***b");
    }
}
