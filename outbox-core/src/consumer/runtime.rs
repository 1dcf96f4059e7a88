//! [`Runtime`]: the consumer loop over a [`Transport`]: receive, park or decode and run the
//! handler with retries (an outage's for as long as it takes, poison's up to `max_attempts`),
//! dead-letter or skip, then acknowledge.

use std::collections::VecDeque;
use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::dead_letter::Kind;
use super::dispatch::{Dispatch, Handled, Undecodable};
use super::options::Policy;
use super::parking::Parking;
use super::policy::{AfterDeadLetter, NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy};
use super::received::Received;
use super::stats::ConsumerStats;
use super::trace;
use super::transport::Transport;
use crate::DecodeError;
use crate::backoff::{Backoff, SplitMix};
use crate::fault::{ErrorClass, Permanent, chain_text, classify_with};

/// Waits between attempts to reach a broker that refuses the dead letter or the commit.
pub(super) const OUTAGE_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(10),
    multiplier: 2.0,
    jitter: 0.2,
};

/// A classifier given to the builder (a closure may capture).
pub(crate) type UserClassifier =
    Arc<dyn Fn(&(dyn Error + 'static)) -> Option<ErrorClass> + Send + Sync>;

/// What an adapter's builder hands the runtime: everything but the transport.
pub(crate) struct Settings<M> {
    /// The consumer's name at the broker (Kafka's group), in dead letters and logs.
    pub(crate) group: String,
    pub(crate) dispatch: Dispatch<M>,
    pub(crate) policy: Policy,
}

/// A consumer: one transport, the settings, and the state that outlives a message.
pub(crate) struct Runtime<T: Transport> {
    pub(crate) transport: T,
    pub(crate) settings: Settings<T::Message>,
    pub(super) stats: Arc<ConsumerStats>,
    pub(super) rng: SplitMix,
    /// What arrived while a message was held: handled next, in order.
    pub(super) stashed: VecDeque<T::Message>,
    pub(super) parking: Parking,
}

/// The shutdown signal, fused: once it fired, [`Stop::wait`] returns at once.
pub(super) struct Stop<'a> {
    signal: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
}

impl<'a> Stop<'a> {
    fn new(signal: impl Future<Output = ()> + Send + 'a) -> Self {
        Stop {
            signal: Some(Box::pin(signal)),
        }
    }

    /// Completes when shutdown was asked for (at once if it already was).
    pub(super) async fn wait(&mut self) {
        if let Some(signal) = self.signal.as_mut() {
            signal.await;
            self.signal = None;
        }
    }

    fn stopping(&self) -> bool {
        self.signal.is_none()
    }
}

/// How handling one message ended.
pub(super) enum Done {
    /// It may be acknowledged (Kafka: its offset stored).
    Yes,
    /// Shutdown came first: not acknowledged, the message is read again after a restart.
    Stopped,
}

impl<T: Transport> Runtime<T> {
    pub(crate) fn new(transport: T, settings: Settings<T::Message>) -> Self {
        let parking = Parking::new(settings.policy.max_parked_keys);
        Runtime {
            transport,
            settings,
            stats: Arc::default(),
            rng: SplitMix::seeded(),
            stashed: VecDeque::new(),
            parking,
        }
    }

    /// The consumer's counters.
    pub(crate) fn stats(&self) -> Arc<ConsumerStats> {
        self.stats.clone()
    }

    /// Starts the transport and handles messages until `shutdown` completes; then lets the
    /// message in flight finish (within the shutdown grace), closes the transport (which
    /// commits what was acknowledged) and returns. Broker errors are logged and retried: the
    /// consumer never stops on its own.
    pub(crate) async fn run(mut self, shutdown: impl Future<Output = ()> + Send) {
        let mut stop = Stop::new(shutdown);
        self.transport.start().await;
        let mut outage = 0u32;
        while !stop.stopping() {
            let message = match self.stashed.pop_front() {
                // Read while a message was held (see `hold`): next in line.
                Some(message) => Ok(message),
                None => tokio::select! {
                    biased;
                    () = stop.wait() => break,
                    received = self.transport.receive() => received,
                },
            };
            let message = match message {
                Ok(message) => {
                    outage = 0;
                    message
                }
                Err(e) => {
                    outage += 1;
                    let wait = OUTAGE_BACKOFF.delay(outage, self.rng.unit());
                    tracing::warn!(error = %e, retry_in = ?wait, "reading from {} failed", T::BROKER);
                    tokio::select! {
                        () = stop.wait() => break,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            ConsumerStats::add(&self.stats.received, "outbox_consumer_received_total");
            let span = trace::message_span(&message, T::SYSTEM);
            let handling = self.handle(&message, &mut stop);
            let done = handling.instrument(span.clone()).await;
            trace::ended(&span, &done);
            if self
                .stats
                .waiting_for_upgrade
                .swap(0, std::sync::atomic::Ordering::Relaxed)
                == 1
            {
                metrics::gauge!("outbox_consumer_waiting_for_upgrade").set(0.0);
            }
            if let Done::Yes = done {
                self.acknowledge(&message).await;
            }
            self.transport.resume();
            if let Done::Stopped = done {
                break;
            }
        }
        self.stop().await;
    }

    /// Handles one message: park, or decode and run the handler with retries (an outage's for
    /// as long as it takes, poison's up to `max_attempts`), then dead-letter or skip.
    async fn handle(&mut self, message: &T::Message, stop: &mut Stop<'_>) -> Done {
        let handler = self.settings.dispatch.handler_for(message);
        if let Err(Undecodable::NoHandler {
            aggregate_type,
            event_type,
            ..
        }) = &handler
            && self.settings.policy.unhandled == UnhandledPolicy::Acknowledge
        {
            // Before parking: an event this consumer does not handle is no part of its keys'
            // order, and writing it to the dead-letter topic would say it failed.
            tracing::debug!(
                topic = message.source(), partition = message.partition(),
                offset = message.position(), %aggregate_type, %event_type,
                "acknowledging a message of an event type without a handler"
            );
            trace::outcome("unhandled");
            self.stats
                .unhandled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!(
                "outbox_consumer_unhandled_total",
                "aggregate_type" => aggregate_type.clone(),
                "event_type" => event_type.clone(),
            )
            .increment(1);
            return Done::Yes;
        }
        if self.settings.policy.after_dead_letter == AfterDeadLetter::ParkKey
            && let Some(head) = self.parking.head_of(message)
        {
            let why = format!(
                "parked behind the dead letter of {} (an earlier message of the same key)",
                head.coordinates()
            );
            tracing::warn!(
                topic = message.source(), partition = message.partition(),
                offset = message.position(), behind = %head.coordinates(),
                "parking a message behind the dead letter of its key"
            );
            trace::outcome("parked");
            return self
                .dead_letter(message, Kind::Parked(head), &why, 0, stop)
                .await;
        }
        let handler = match handler {
            Ok(handler) => handler,
            Err(why) => return self.undecodable(message, &why, stop).await,
        };
        let (mut attempt, mut outage) = (0, 0);
        loop {
            let run = match handler.call(message) {
                Ok(run) => run,
                Err(e @ DecodeError::VersionTooNew { .. })
                    if self.settings.policy.newer_version == NewerVersionPolicy::Hold =>
                {
                    outage += 1;
                    if !self.wait_for_upgrade(message, &e, outage, stop).await {
                        return Done::Stopped;
                    }
                    continue;
                }
                Err(e) => {
                    return self
                        .undecodable(message, &Undecodable::Decode(e), stop)
                        .await;
                }
            };
            // Its own task: a handler that panics fails this attempt instead of the consumer
            // (which, restarted, would read the same message and panic again).
            let started = std::time::Instant::now();
            let mut run = tokio::spawn(run.instrument(tracing::Span::current()));
            let joined = tokio::select! {
                biased;
                joined = &mut run => joined,
                () = stop.wait() => {
                    // Let the transaction in flight finish, within the grace.
                    match tokio::time::timeout(self.settings.policy.shutdown_grace, &mut run).await {
                        Ok(joined) => joined,
                        Err(_) => {
                            run.abort();
                            tracing::warn!(
                                topic = message.source(), partition = message.partition(),
                                offset = message.position(),
                                "the handler did not finish within the shutdown grace; the \
                                 message will be read again"
                            );
                            return Done::Stopped;
                        }
                    }
                }
            };
            let outcome = joined.unwrap_or_else(|e| Err(Permanent::new(panic_message(e)).into()));
            metrics::histogram!("outbox_consumer_handler_duration_seconds")
                .record(started.elapsed());
            let error = match outcome {
                Ok(Handled::Applied) => {
                    trace::outcome("applied");
                    ConsumerStats::add(&self.stats.applied, "outbox_consumer_applied_total");
                    return Done::Yes;
                }
                Ok(Handled::Duplicate) => {
                    trace::outcome("duplicate");
                    ConsumerStats::add(&self.stats.duplicates, "outbox_consumer_duplicate_total");
                    return Done::Yes;
                }
                Err(error) => error,
            };
            let text = chain_text(&*error);
            let wait = if self.classify(&*error) == ErrorClass::Transient {
                ConsumerStats::add(
                    &self.stats.transient_errors,
                    "outbox_consumer_transient_errors_total",
                );
                outage += 1;
                let wait = self
                    .settings
                    .policy
                    .outage_backoff
                    .delay(outage, self.rng.unit());
                // Every failure of a long outage at `warn` would flood the log: the first, then
                // one in ten.
                if outage == 1 || outage % 10 == 0 {
                    tracing::warn!(
                        topic = message.source(), partition = message.partition(),
                        offset = message.position(), failures = outage, error = %text,
                        retry_in = ?wait,
                        "the handler failed with a transient error (an outage); its partitions \
                         are paused and it is retried until it passes"
                    );
                }
                wait
            } else {
                ConsumerStats::add(
                    &self.stats.handler_errors,
                    "outbox_consumer_handler_errors_total",
                );
                outage = 0;
                attempt += 1;
                if attempt >= self.settings.policy.max_attempts {
                    tracing::error!(
                        topic = message.source(), partition = message.partition(),
                        offset = message.position(), attempts = attempt, error = %text,
                        "the handler failed every attempt; dead-lettering the message"
                    );
                    trace::outcome("dead_lettered");
                    return self
                        .dead_letter(message, Kind::Handler, &text, attempt, stop)
                        .await;
                }
                let wait = self.settings.policy.backoff.delay(attempt, self.rng.unit());
                tracing::warn!(
                    topic = message.source(), partition = message.partition(),
                    offset = message.position(), attempt, error = %text, retry_in = ?wait,
                    "the handler failed; retrying"
                );
                wait
            };
            if !self.hold(wait, stop).await {
                return Done::Stopped;
            }
        }
    }

    /// Holds a message whose version is newer than its handler knows for the `failures`-th
    /// time, as an outage: the outage backoff with the partitions paused. `false` if shutdown
    /// came first.
    async fn wait_for_upgrade(
        &mut self,
        message: &T::Message,
        why: &DecodeError,
        failures: u32,
        stop: &mut Stop<'_>,
    ) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let wait = self
            .settings
            .policy
            .outage_backoff
            .delay(failures, self.rng.unit());
        ConsumerStats::add(
            &self.stats.newer_version_attempts,
            "outbox_consumer_newer_version_attempts_total",
        );
        if failures == 1 || failures.is_multiple_of(10) {
            tracing::warn!(
                topic = message.source(), partition = message.partition(),
                offset = message.position(), failures, error = %why, retry_in = ?wait,
                "a message is newer than this consumer knows; its partitions are paused until \
                 a consumer that knows its version is deployed"
            );
        }
        if self.stats.waiting_for_upgrade.swap(1, Relaxed) == 0 {
            metrics::gauge!("outbox_consumer_waiting_for_upgrade").set(1.0);
        }
        self.hold(wait, stop).await
    }

    /// The fault class of a handler's error: link by link, the markers, the builder's
    /// classifiers, the registered ones and the built-in ones (see [`crate::fault`]).
    fn classify(&self, error: &(dyn Error + 'static)) -> ErrorClass {
        classify_with(error, |e| {
            self.settings.policy.classifiers.iter().find_map(|c| c(e))
        })
    }

    async fn undecodable(
        &mut self,
        message: &T::Message,
        why: &Undecodable,
        stop: &mut Stop<'_>,
    ) -> Done {
        let error = why.to_string();
        match self.settings.policy.undecodable {
            UndecodablePolicy::Skip => {
                tracing::error!(
                    topic = message.source(), partition = message.partition(),
                    offset = message.position(), error = %error,
                    "skipping a message that cannot be handled"
                );
                trace::outcome("skipped");
                ConsumerStats::add(&self.stats.skipped, "outbox_consumer_skipped_total");
                Done::Yes
            }
            UndecodablePolicy::DeadLetter => {
                tracing::error!(
                    topic = message.source(), partition = message.partition(),
                    offset = message.position(), error = %error,
                    "dead-lettering a message that cannot be handled"
                );
                trace::outcome("dead_lettered");
                self.dead_letter(message, Kind::Undecodable, &error, 0, stop)
                    .await
            }
        }
    }

    /// Closes the transport: commits what was acknowledged, leaves.
    async fn stop(self) {
        let group = self.settings.group;
        self.transport.close().await;
        tracing::info!(group = %group, "consumer stopped");
    }
}

/// A failed attempt's error for a handler task that panicked (or was cancelled).
fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "the handler was cancelled".to_owned();
    }
    let payload = e.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".to_owned());
    format!("the handler panicked: {text}")
}
