//! The builder methods every broker's consumer builder shares: its handlers and its policies,
//! written once and stamped into each builder (whose `options` field is an
//! [`Options`](super::Options)), so that the three builders cannot drift apart.

/// Expands, inside `impl SomeConsumerBuilder`, to the handler and policy methods. `$builder`
/// is how a doc example gets a builder, e.g. `"outbox_core::kafka::KafkaConsumer::builder()"`.
macro_rules! policy_methods {
    ($builder:literal) => {
        /// Handles every event type `E` carries ([`OutboxEvent::EVENT_TYPES`](crate::OutboxEvent::EVENT_TYPES))
        /// with `handler`.
        ///
        /// The handler gets the decoded [`Envelope<E>`](crate::Envelope) and returns what an
        /// `#[idempotent]` function returns: `Ok(Outcome::Applied(_))` or
        /// `Ok(Outcome::Duplicate)` when the message is done (it is then acknowledged), or
        /// `Err(e)`, any error that converts into a boxed error (`std::io::Error`,
        /// `diesel::result::Error`, your own error type, `anyhow::Error`, `String`, ...). The
        /// error and its `source()` chain are classified ([`crate::fault`]): a transient one
        /// (an outage) is retried with the [`outage_backoff`](Self::outage_backoff) until it
        /// passes; any other is retried with the [`retry_backoff`](Self::retry_backoff) and,
        /// after [`max_attempts`](Self::max_attempts), dead-lettered with the error chain in
        /// the [`DLT_HEADER_ERROR`](crate::consumer::DLT_HEADER_ERROR) header. A handler that
        /// panics fails its attempt as a permanent error (each attempt runs as its own task),
        /// so a bad message cannot crash the consumer in a loop. Each attempt decodes the
        /// message again, so `E` need not be `Clone`. An event type may have one handler.
        ///
        /// For the database's errors to be recognised, the error you return must keep them in
        /// its chain: return the `diesel::result::Error` (or pool error) itself, or an error
        /// type of yours that has it as its `source()` (thiserror's `#[from]` or `#[source]`),
        /// not a string made of it.
        ///
        /// ```
        /// # use outbox_core as outbox;
        /// use outbox_core::{Envelope, Outcome, OutboxEvent};
        /// #[derive(serde::Serialize, serde::Deserialize, OutboxEvent)]
        /// #[outbox(crate = outbox_core, aggregate = "order")]
        /// enum OrderEvent {
        ///     Created(#[outbox(aggregate_id)] u64),
        ///     Cancelled(#[outbox(aggregate_id)] u64),
        /// }
        ///
        /// // One handler for both event types of the enum.
        #[doc = concat!("let builder = ", $builder, ".handler(|event: Envelope<OrderEvent>| async move {")]
        ///     match event.payload {
        ///         OrderEvent::Created(id) | OrderEvent::Cancelled(id) => println!("order {id}"),
        ///     }
        ///     Ok::<_, String>(Outcome::Applied(()))
        /// });
        /// # drop(builder);
        /// ```
        pub fn handler<E, F, Fut, T, Err>(mut self, handler: F) -> Self
        where
            E: crate::OutboxEvent + serde::de::DeserializeOwned + Send + 'static,
            F: Fn(crate::Envelope<E>) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<crate::Outcome<T>, Err>> + Send + 'static,
            T: Send + 'static,
            Err: Into<crate::BoxError> + Send + 'static,
        {
            self.options.handler(handler);
            self
        }

        /// How many permanent failures of a handler on one message lead to its dead letter
        /// (default 5; at least 1). Transient failures (outages) do not count.
        ///
        /// ```
        #[doc = concat!("let builder = ", $builder, ".max_attempts(10);")]
        /// # drop(builder);
        /// ```
        pub fn max_attempts(mut self, attempts: u32) -> Self {
            self.options.policy.max_attempts = attempts;
            self
        }

        /// The wait between attempts after a permanent failure (default
        /// [`DEFAULT_RETRY_BACKOFF`](crate::consumer::DEFAULT_RETRY_BACKOFF)). Delivery is
        /// paused and the broker's client served meanwhile, so the waits may add up to any
        /// length. `build` refuses a backoff that
        /// [`Backoff::validate`](crate::backoff::Backoff::validate) refuses, naming
        /// `retry_backoff.<field>`.
        ///
        /// ```
        /// use std::time::Duration;
        /// use outbox_core::relay::Backoff;
        #[doc = concat!("let builder = ", $builder, ".retry_backoff(Backoff {")]
        ///     initial: Duration::from_millis(500),
        ///     max: Duration::from_secs(10),
        ///     multiplier: 2.0,
        ///     jitter: 0.2,
        /// });
        /// # drop(builder);
        /// ```
        pub fn retry_backoff(mut self, backoff: crate::backoff::Backoff) -> Self {
            self.options.policy.backoff = backoff;
            self
        }

        /// The wait between attempts after a transient failure, an outage (default
        /// [`DEFAULT_OUTAGE_BACKOFF`](crate::consumer::DEFAULT_OUTAGE_BACKOFF): 100 ms
        /// doubling to 2 s). The message is retried for as long as the outage lasts, delivery
        /// paused and the client served; `max` bounds how long after the outage's end the
        /// consumer goes on. `build` refuses a backoff that
        /// [`Backoff::validate`](crate::backoff::Backoff::validate) refuses, naming
        /// `outage_backoff.<field>`.
        ///
        /// ```
        /// use std::time::Duration;
        /// use outbox_core::relay::Backoff;
        #[doc = concat!("let builder = ", $builder, ".outage_backoff(Backoff {")]
        ///     initial: Duration::from_millis(50),
        ///     max: Duration::from_secs(1),
        ///     multiplier: 2.0,
        ///     jitter: 0.2,
        /// });
        /// # drop(builder);
        /// ```
        pub fn outage_backoff(mut self, backoff: crate::backoff::Backoff) -> Self {
            self.options.policy.outage_backoff = backoff;
            self
        }

        /// Adds a classifier of handler errors, asked for each link of an error's `source()`
        /// chain after the [`Transient`](crate::fault::Transient) and
        /// [`Permanent`](crate::fault::Permanent) markers and before the registered and
        /// built-in classifiers (see [`crate::fault`]). `None` lets the others decide.
        ///
        /// ```
        /// use outbox_core::fault::ErrorClass;
        /// // An HTTP client's 503, recognised by a type of its own in your code.
        /// #[derive(Debug)]
        /// struct Unavailable;
        /// # impl std::fmt::Display for Unavailable {
        /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("503") }
        /// # }
        /// # impl std::error::Error for Unavailable {}
        #[doc = concat!("let builder = ", $builder)]
        ///     .classifier(|e| e.is::<Unavailable>().then_some(ErrorClass::Transient));
        /// # drop(builder);
        /// ```
        pub fn classifier(
            mut self,
            classifier: impl Fn(&(dyn std::error::Error + 'static)) -> Option<crate::fault::ErrorClass>
            + Send
            + Sync
            + 'static,
        ) -> Self {
            self.options.classifier(classifier);
            self
        }

        /// Lets the errors of type `T` in a handler's error chain say their class
        /// ([`ClassifyError`](crate::fault::ClassifyError)).
        ///
        /// ```
        /// use outbox_core::fault::{ClassifyError, ErrorClass};
        /// #[derive(Debug)]
        /// enum BillingError { ProviderDown, CardDeclined }
        /// # impl std::fmt::Display for BillingError {
        /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
        /// # }
        /// # impl std::error::Error for BillingError {}
        /// impl ClassifyError for BillingError {
        ///     fn error_class(&self) -> Option<ErrorClass> {
        ///         matches!(self, BillingError::ProviderDown).then_some(ErrorClass::Transient)
        ///     }
        /// }
        #[doc = concat!("let builder = ", $builder, ".classify_errors_of::<BillingError>();")]
        /// # drop(builder);
        /// ```
        pub fn classify_errors_of<T: crate::fault::ClassifyError>(self) -> Self {
            self.classifier(crate::fault::classifier_of::<T>)
        }

        /// What happens to the later messages of a key once one was dead-lettered (default
        /// [`AfterDeadLetter::ParkKey`](crate::consumer::AfterDeadLetter::ParkKey): they
        /// follow it to the dead letters, marked as parked).
        ///
        /// ```
        /// use outbox_core::consumer::AfterDeadLetter;
        #[doc = concat!("let builder = ", $builder, ".after_dead_letter(AfterDeadLetter::SkipAhead);")]
        /// # drop(builder);
        /// ```
        pub fn after_dead_letter(mut self, policy: crate::consumer::AfterDeadLetter) -> Self {
            self.options.policy.after_dead_letter = policy;
            self
        }

        /// How many parked keys the consumer remembers (default
        /// [`DEFAULT_MAX_PARKED_KEYS`](crate::consumer::DEFAULT_MAX_PARKED_KEYS), about 100
        /// bytes each plus the key). Beyond it the oldest is forgotten, logged at `error`: its
        /// later messages are applied again. Parked keys live in memory only; a restart
        /// forgets them all.
        ///
        /// ```
        #[doc = concat!("let builder = ", $builder, ".max_parked_keys(1_000_000);")]
        /// # drop(builder);
        /// ```
        pub fn max_parked_keys(mut self, keys: usize) -> Self {
            self.options.policy.max_parked_keys = keys;
            self
        }

        /// What to do with a message that cannot be handled at all (default:
        /// [`UndecodablePolicy::DeadLetter`](crate::consumer::UndecodablePolicy::DeadLetter)).
        ///
        /// ```
        /// use outbox_core::consumer::UndecodablePolicy;
        #[doc = concat!("let builder = ", $builder, ".on_undecodable(UndecodablePolicy::Skip);")]
        /// # drop(builder);
        /// ```
        pub fn on_undecodable(mut self, policy: crate::consumer::UndecodablePolicy) -> Self {
            self.options.policy.undecodable = policy;
            self
        }

        /// What to do with a message of an event type that has no handler (default:
        /// [`UnhandledPolicy::Acknowledge`](crate::consumer::UnhandledPolicy::Acknowledge)).
        ///
        /// ```
        /// use outbox_core::consumer::UnhandledPolicy;
        #[doc = concat!("let builder = ", $builder, ".on_unhandled(UnhandledPolicy::Undecodable);")]
        /// # drop(builder);
        /// ```
        pub fn on_unhandled(mut self, policy: crate::consumer::UnhandledPolicy) -> Self {
            self.options.policy.unhandled = policy;
            self
        }

        /// What to do with a message whose version is newer than its handler knows (default:
        /// [`NewerVersionPolicy::Hold`](crate::consumer::NewerVersionPolicy::Hold)).
        ///
        /// ```
        /// use outbox_core::consumer::NewerVersionPolicy;
        #[doc = concat!("let builder = ", $builder, ".on_newer_version(NewerVersionPolicy::Undecodable);")]
        /// # drop(builder);
        /// ```
        pub fn on_newer_version(mut self, policy: crate::consumer::NewerVersionPolicy) -> Self {
            self.options.policy.newer_version = policy;
            self
        }

        /// On shutdown, how long the message in flight may take to finish (default 30 s).
        /// After that its handler is dropped unfinished and the message is delivered again
        /// after a restart.
        ///
        /// ```
        /// # use std::time::Duration;
        #[doc = concat!("let builder = ", $builder, ".shutdown_grace(Duration::from_secs(5));")]
        /// # drop(builder);
        /// ```
        pub fn shutdown_grace(mut self, grace: std::time::Duration) -> Self {
            self.options.policy.shutdown_grace = grace;
            self
        }
    };
}

pub(crate) use policy_methods;
