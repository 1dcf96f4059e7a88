//! The parts of a database URL the connectors read themselves.

use std::borrow::Cow;

/// `host:port` of a URL's authority (user and password dropped; `default_port` when none is
/// given).
pub(crate) fn server_of(base: &str, default_port: u16) -> String {
    let rest = base.split_once("://").map_or(base, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or("");
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let hosts = decode(hosts);
    if hosts.is_empty() {
        return format!("localhost:{default_port}");
    }
    hosts
        .split(',')
        .map(|h| {
            let has_port = match h.rfind(']') {
                Some(end) => h[end..].contains(':'),
                None => h.contains(':'),
            };
            if has_port {
                h.to_owned()
            } else {
                format!("{h}:{default_port}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Percent-decodes a URL component (an invalid escape stays as written).
pub(crate) fn decode(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}
