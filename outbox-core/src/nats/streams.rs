//! The connection both sides open, and the streams they need: found by subject, or created.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::stream;

use super::error::NatsConfigError;
use super::subject::{stream_name, wildcard};

/// Connects to `servers` (comma-separated URLs) in the background: the client retries the
/// first connection and every later one for as long as it lives, so that a server down at
/// start-up is an outage like any other. Only a malformed address fails here.
pub(crate) async fn connect(
    servers: &str,
    name: &str,
    api_timeout: Duration,
) -> Result<async_nats::Client, NatsConfigError> {
    let addresses = servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<async_nats::ServerAddr>()
                .map_err(|e| NatsConfigError::InvalidOption {
                    option: "servers".into(),
                    // The parser's message quotes no part of the address (it may hold a
                    // password): the address is shown redacted.
                    reason: format!("`{}` is not a NATS server address: {e}", redacted(s)),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if addresses.is_empty() {
        return Err(NatsConfigError::InvalidOption {
            option: "servers".into(),
            reason: "no server: give at least one, e.g. `nats://127.0.0.1:4222`".into(),
        });
    }
    let shown = redacted(servers);
    let log = Arc::new(EventLog::default());
    async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .request_timeout(Some(api_timeout))
        .event_callback(move |event| {
            log.record(&shown, &event);
            std::future::ready(())
        })
        .connect(addresses)
        .await
        .map_err(|e| NatsConfigError::InvalidOption {
            option: "servers".into(),
            reason: format!("cannot connect: {}", e.kind()),
        })
}

/// How often at most a client error (a refused or failed connection attempt, repeated while
/// the server is away) is logged; the count of those left out comes with the next line.
const ERROR_EVERY: Duration = Duration::from_secs(30);

/// The client's events as log lines of this crate: a change of connection at `info` or
/// `warn`, client and server errors at `warn` at most once per [`ERROR_EVERY`]. (async-nats
/// also logs each event at `info` under its own target, once per reconnect attempt: the
/// `outbox` binary's default filter keeps `async_nats` at `warn`.)
#[derive(Default)]
struct EventLog {
    /// When the last error line was written, and how many errors were left out since.
    errors: Mutex<(Option<Instant>, u64)>,
}

impl EventLog {
    fn record(&self, servers: &str, event: &async_nats::Event) {
        use async_nats::Event;
        match event {
            Event::Connected => tracing::info!(servers, "connected to NATS"),
            Event::Disconnected => {
                tracing::warn!(servers, "disconnected from NATS; reconnecting")
            }
            Event::ServerError(_) | Event::ClientError(_) => {
                let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
                let (last, left_out) = &mut *errors;
                if last.is_none_or(|at| at.elapsed() >= ERROR_EVERY) {
                    tracing::warn!(servers, error = %event, left_out = *left_out, "NATS client error");
                    *last = Some(Instant::now());
                    *left_out = 0;
                } else {
                    *left_out += 1;
                }
            }
            other => tracing::info!(servers, event = %other, "NATS"),
        }
    }
}

/// `servers` with any password replaced by `***`.
pub(crate) fn redacted(servers: &str) -> String {
    crate::redact::urls(servers)
}

/// The stream that holds `topic`'s subjects (`<topic>.>`): the one that captures them, else a
/// new file-backed stream named [`stream_name`]`(topic)` with JetStream's defaults (among them
/// a duplicate window of 2 minutes). `Err` says why, for an outage message.
pub(crate) async fn ensure(jetstream: &Context, topic: &str) -> Result<String, String> {
    let subjects = wildcard(topic);
    match jetstream.stream_by_subject(subjects.clone()).await {
        Ok(name) => return Ok(name),
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {}
        Err(e) => return Err(format!("looking up the stream of `{subjects}` failed: {e}")),
    }
    let config = stream::Config {
        name: stream_name(topic),
        subjects: vec![subjects.clone()],
        ..Default::default()
    };
    match jetstream.get_or_create_stream(config).await {
        Ok(stream) => {
            tracing::info!(stream = %stream.cached_info().config.name, subjects, "created a JetStream stream");
            Ok(stream.cached_info().config.name.clone())
        }
        Err(e) => Err(format!(
            "creating the stream `{}` for `{subjects}` failed: {e}",
            stream_name(topic)
        )),
    }
}
