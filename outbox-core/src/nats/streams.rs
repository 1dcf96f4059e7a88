//! The connection both sides open, and the streams they need: found by subject, or created.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::stream;

use super::error::NatsConfigError;
use super::subject::{stream_name, wildcard};
use crate::broker_tls::TlsFiles;

/// A client connected in the background, with what it needs to explain a failure.
pub(crate) struct Connected {
    pub(crate) client: async_nats::Client,
    /// The client's connection events (the publisher's `ready` reads them).
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(crate) events: Arc<EventLog>,
    /// How it connects, for [`Recipe::diagnose`].
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(crate) recipe: Recipe,
}

/// The servers and the options of a connection.
pub(crate) struct Recipe {
    addresses: Vec<async_nats::ServerAddr>,
    name: String,
    api_timeout: Duration,
    tls: TlsFiles,
    /// The contents of the `.creds` file (a JWT and its seed): a secret, never shown.
    credentials: Option<String>,
}

impl Recipe {
    fn options(&self) -> async_nats::ConnectOptions {
        let mut options = match &self.credentials {
            // Parsed once already, when the builder built.
            Some(creds) => async_nats::ConnectOptions::with_credentials(creds)
                .unwrap_or_else(|_| async_nats::ConnectOptions::new()),
            None => async_nats::ConnectOptions::new(),
        };
        options = options
            .name(&self.name)
            .request_timeout(Some(self.api_timeout));
        if let Some(ca) = &self.tls.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        options.require_tls(self.tls.is_set())
    }

    /// One connection attempt of its own, without retries: why the servers cannot be
    /// reached, with the cause (e.g. `invalid peer certificate: UnknownIssuer`), which the
    /// retrying client's events leave out. `None` if it connects or takes over `timeout`.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(crate) async fn diagnose(&self, timeout: Duration) -> Option<String> {
        let attempt = self
            .options()
            .connection_timeout(timeout)
            .connect(self.addresses.clone());
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Err(e)) => Some(e.to_string()),
            Ok(Ok(client)) => {
                drop(client.drain().await);
                None
            }
            Err(_) => None,
        }
    }
}

/// Connects to `servers` (comma-separated URLs) in the background: the client retries the
/// first connection and every later one for as long as it lives, so that a server down at
/// start-up is an outage like any other. Only a malformed address or TLS file fails here.
/// With TLS files, TLS is required whatever the URLs' scheme.
pub(crate) async fn connect(
    servers: &str,
    name: &str,
    api_timeout: Duration,
    tls: &TlsFiles,
    credentials: Option<&Path>,
) -> Result<Connected, NatsConfigError> {
    tls.load().map_err(|e| NatsConfigError::InvalidOption {
        option: e.option.into(),
        reason: e.reason,
    })?;
    let credentials = credentials.map(read_credentials).transpose()?;
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
    let recipe = Recipe {
        addresses,
        name: name.to_owned(),
        api_timeout,
        tls: tls.clone(),
        credentials,
    };
    let shown = redacted(servers);
    let events = Arc::new(EventLog::default());
    let client = recipe
        .options()
        .retry_on_initial_connect()
        .event_callback({
            let events = events.clone();
            move |event| {
                events.record(&shown, &event);
                std::future::ready(())
            }
        })
        .connect(recipe.addresses.clone())
        .await
        .map_err(|e| NatsConfigError::InvalidOption {
            option: "servers".into(),
            reason: format!("cannot connect: {}", e.kind()),
        })?;
    Ok(Connected {
        client,
        events,
        recipe,
    })
}

/// Reads a `.creds` file and checks that it holds a user JWT and its seed. The error names
/// the path, never the file's contents.
fn read_credentials(path: &Path) -> Result<String, NatsConfigError> {
    let invalid = |reason: String| NatsConfigError::InvalidOption {
        option: "credentials_file".into(),
        reason,
    };
    let creds = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("cannot read `{}`: {e}", path.display())))?;
    match async_nats::ConnectOptions::with_credentials(&creds) {
        Ok(_) => Ok(creds),
        Err(_) => Err(invalid(format!(
            "`{}` is not a NATS credentials file (a `-----BEGIN NATS USER JWT-----` block and a \
             `-----BEGIN USER NKEY SEED-----` block, as `nsc` writes them)",
            path.display()
        ))),
    }
}

/// How often at most a client error (a refused or failed connection attempt, repeated while
/// the server is away) is logged; the count of those left out comes with the next line.
const ERROR_EVERY: Duration = Duration::from_secs(30);

/// The client's events as log lines of this crate: a change of connection at `info` or
/// `warn`, client and server errors at `warn` at most once per [`ERROR_EVERY`]. (async-nats
/// also logs each event at `info` under its own target, once per reconnect attempt: the
/// `outbox` binary's default filter keeps `async_nats` at `warn`.)
#[derive(Default)]
pub(crate) struct EventLog {
    /// When the last error line was written, and how many errors were left out since.
    errors: Mutex<(Option<Instant>, u64)>,
    /// The last client or server error, e.g. why the connection cannot be made.
    last_error: Mutex<Option<String>>,
}

impl EventLog {
    /// The last client or server error since the connection was last made.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, servers: &str, event: &async_nats::Event) {
        use async_nats::Event;
        match event {
            Event::Connected => {
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                tracing::info!(servers, "connected to NATS")
            }
            Event::Disconnected => {
                tracing::warn!(servers, "disconnected from NATS; reconnecting")
            }
            Event::ServerError(_) | Event::ClientError(_) => {
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(event.to_string());
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
