//! [`Options`]: the broker-free half of a consumer builder (handlers, policies, backoffs),
//! with its defaults and checks, so that every adapter's builder offers and checks them alike.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::dispatch::Dispatch;
use super::policy::{
    AfterDeadLetter, DEFAULT_MAX_PARKED_KEYS, DEFAULT_OUTAGE_BACKOFF, DEFAULT_RETRY_BACKOFF,
    NewerVersionPolicy, UndecodablePolicy, UnhandledPolicy,
};
use super::received::Received;
use super::runtime::{Settings, UserClassifier};
use crate::backoff::Backoff;
use crate::fault::ErrorClass;
use crate::{BoxError, Envelope, OutboxEvent, Outcome};

/// What a consumer builder collects besides its broker's settings.
pub(crate) struct Options<M> {
    dispatch: Dispatch<M>,
    /// The first event type given two handlers, refused by [`Options::settings`].
    duplicate_handler: Option<(String, String)>,
    pub(crate) policy: Policy,
}

impl<M> Default for Options<M> {
    fn default() -> Self {
        Options {
            dispatch: Dispatch::default(),
            duplicate_handler: None,
            policy: Policy::default(),
        }
    }
}

/// What a consumer does with each kind of failure, and how long it waits: every adapter's
/// builder sets these, and the runtime reads them.
pub(crate) struct Policy {
    pub(crate) undecodable: UndecodablePolicy,
    pub(crate) unhandled: UnhandledPolicy,
    pub(crate) newer_version: NewerVersionPolicy,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) outage_backoff: Backoff,
    pub(crate) classifiers: Vec<UserClassifier>,
    pub(crate) after_dead_letter: AfterDeadLetter,
    pub(crate) max_parked_keys: usize,
    pub(crate) shutdown_grace: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            undecodable: UndecodablePolicy::default(),
            unhandled: UnhandledPolicy::default(),
            newer_version: NewerVersionPolicy::default(),
            max_attempts: 5,
            backoff: DEFAULT_RETRY_BACKOFF,
            outage_backoff: DEFAULT_OUTAGE_BACKOFF,
            classifiers: Vec::new(),
            after_dead_letter: AfterDeadLetter::default(),
            max_parked_keys: DEFAULT_MAX_PARKED_KEYS,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

impl<M: Received> Options<M> {
    /// Handles every event type `E` carries with `handler` (a second handler of a type is
    /// refused by [`settings`](Self::settings)).
    pub(crate) fn handler<E, F, Fut, T, Err>(&mut self, handler: F)
    where
        E: OutboxEvent + DeserializeOwned + Send + 'static,
        F: Fn(Envelope<E>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Err>> + Send + 'static,
        T: Send + 'static,
        Err: Into<BoxError> + Send + 'static,
    {
        if let Err(key) = self.dispatch.add(handler)
            && self.duplicate_handler.is_none()
        {
            self.duplicate_handler = Some(key);
        }
    }

    /// Adds a classifier of handler errors.
    pub(crate) fn classifier(
        &mut self,
        classifier: impl Fn(&(dyn Error + 'static)) -> Option<ErrorClass> + Send + Sync + 'static,
    ) {
        self.policy.classifiers.push(Arc::new(classifier));
    }

    /// The runtime's settings for consumer `group`, or the builder option at fault and why.
    pub(crate) fn settings(self, group: String) -> Result<Settings<M>, (String, String)> {
        let invalid = |option: &str, reason: String| Err((option.to_owned(), reason));
        if self.dispatch.is_empty() {
            return invalid(
                "handler",
                "a consumer needs at least one handler: call `.handler(...)`".into(),
            );
        }
        if let Some((aggregate_type, event_type)) = self.duplicate_handler {
            return invalid(
                "handler",
                format!(
                    "event type `{event_type}` of aggregate `{aggregate_type}` has two handlers"
                ),
            );
        }
        if self.policy.max_attempts == 0 {
            return invalid("max_attempts", "at least 1 attempt".into());
        }
        for (backoff, name) in [
            (&self.policy.backoff, "retry_backoff"),
            (&self.policy.outage_backoff, "outage_backoff"),
        ] {
            if let Err(e) = backoff.validate(name) {
                return invalid(e.setting(), e.reason().to_owned());
            }
        }
        Ok(Settings {
            group,
            dispatch: self.dispatch,
            policy: self.policy,
        })
    }
}
