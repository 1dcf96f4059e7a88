//! Typed dispatch: a handler per event type, found by the message's `aggregate_type` and
//! `event_type` headers, which decodes the message into its `Envelope<E>` and runs.

use std::collections::HashMap;
use std::fmt::{self, Display};
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::received::Received;
use crate::{
    BoxError, DecodeError, Envelope, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, OutboxEvent, Outcome,
};

/// What a handler did with a message it decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handled {
    Applied,
    Duplicate,
}

pub(crate) type HandlerFuture =
    Pin<Box<dyn Future<Output = Result<Handled, BoxError>> + Send + 'static>>;

/// A handler with its event type erased: decodes a message of type `M`, then runs.
pub(crate) trait ErasedHandler<M>: Send + Sync {
    fn call(&self, message: &M) -> Result<HandlerFuture, DecodeError>;
}

/// Every `Fn(&message)` that decodes and runs is an [`ErasedHandler`]: [`Dispatch::add`]
/// makes one of each handler the user registers (see [`decode`] and [`erase`]).
impl<M, G> ErasedHandler<M> for G
where
    G: Fn(&M) -> Result<HandlerFuture, DecodeError> + Send + Sync,
{
    fn call(&self, message: &M) -> Result<HandlerFuture, DecodeError> {
        self(message)
    }
}

/// Decodes `message` into the `Envelope<E>` a handler for `E` takes.
pub(crate) fn decode<E: OutboxEvent + DeserializeOwned>(
    message: &impl Received,
) -> Result<Envelope<E>, DecodeError> {
    Envelope::<E>::decode(message.headers(), message.payload())
}

/// A handler's future, its outcome reduced to what the consumer records.
fn erase<T, Err: Into<BoxError>>(
    fut: impl Future<Output = Result<Outcome<T>, Err>> + Send + 'static,
) -> HandlerFuture {
    Box::pin(async move {
        match fut.await {
            Ok(Outcome::Applied(_)) => Ok(Handled::Applied),
            Ok(Outcome::Duplicate) => Ok(Handled::Duplicate),
            Err(e) => Err(e.into()),
        }
    })
}

/// Why a message cannot be handled at all: retrying would not help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Undecodable {
    /// Its headers or payload do not decode (see [`DecodeError`]).
    Decode(DecodeError),
    /// No handler is registered for its event type.
    NoHandler {
        aggregate_type: String,
        event_type: String,
        handled: Vec<String>,
    },
}

impl Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Undecodable::Decode(e) => e.fmt(f),
            Undecodable::NoHandler {
                aggregate_type,
                event_type,
                handled,
            } => write!(
                f,
                "no handler for event type `{event_type}` of aggregate `{aggregate_type}`; this \
                 consumer handles {}",
                handled.join(", ")
            ),
        }
    }
}

/// A registered handler and the version of its event type.
type Registered<M> = (u32, Arc<dyn ErasedHandler<M>>);

/// The handlers of a consumer of messages `M`, by `(aggregate_type, event_type)`.
pub(crate) struct Dispatch<M> {
    handlers: HashMap<(String, String), Registered<M>>,
}

impl<M> Default for Dispatch<M> {
    fn default() -> Self {
        Dispatch {
            handlers: HashMap::new(),
        }
    }
}

impl<M: Received> Dispatch<M> {
    /// Registers `handler` for every event type `E` carries; returns the first type that
    /// already had a handler, if any.
    pub(crate) fn add<E, F, Fut, T, Err>(&mut self, handler: F) -> Result<(), (String, String)>
    where
        E: OutboxEvent + DeserializeOwned + Send + 'static,
        F: Fn(Envelope<E>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Outcome<T>, Err>> + Send + 'static,
        T: Send + 'static,
        Err: Into<BoxError> + Send + 'static,
    {
        let typed = Arc::new(move |message: &M| {
            decode::<E>(message).map(|envelope| erase(handler(envelope)))
        });
        self.register(E::EVENT_TYPES, typed)
    }

    /// Registers `handler` for every event type of `types`; returns the first type that already
    /// had a handler, if any.
    fn register(
        &mut self,
        types: &[crate::EventType],
        handler: Arc<dyn ErasedHandler<M>>,
    ) -> Result<(), (String, String)> {
        for t in types {
            let key = (t.aggregate_type.to_owned(), t.event_type.to_owned());
            if self.handlers.contains_key(&key) {
                return Err(key);
            }
            self.handlers.insert(key, (t.version, handler.clone()));
        }
        Ok(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// The handler of `message`'s event type.
    pub(crate) fn handler_for(
        &self,
        message: &M,
    ) -> Result<Arc<dyn ErasedHandler<M>>, Undecodable> {
        let aggregate_type = header(message, HEADER_AGGREGATE_TYPE)?;
        let event_type = header(message, HEADER_EVENT_TYPE)?;
        match self
            .handlers
            .get(&(aggregate_type.clone(), event_type.clone()))
        {
            Some((_, handler)) => Ok(handler.clone()),
            None => Err(Undecodable::NoHandler {
                aggregate_type,
                event_type,
                handled: self.described(),
            }),
        }
    }

    /// `aggregate/EventType vN` of every handled type, sorted.
    pub(crate) fn described(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .handlers
            .iter()
            .map(|((a, e), (v, _))| format!("{a}/{e} v{v}"))
            .collect();
        all.sort();
        all
    }
}

/// The first header `name` of `message`, as UTF-8.
fn header(message: &impl Received, name: &'static str) -> Result<String, Undecodable> {
    let value = message
        .header(name)
        .ok_or(Undecodable::Decode(DecodeError::MissingHeader { name }))?;
    String::from_utf8(value.to_vec()).map_err(|e| {
        Undecodable::Decode(DecodeError::InvalidHeader {
            name,
            value: String::from_utf8_lossy(e.as_bytes()).into_owned(),
            reason: "not UTF-8".to_owned(),
        })
    })
}
