//! [`Transport`]: what a broker adapter does for the consumer runtime.

use super::dead_letter::{DeadLetter, Unwritten};
use super::received::Received;

/// A broker's side of a consumer: the runtime ([`Runtime`](super::Runtime)) decides what
/// happens to each message, the transport moves it.
///
/// The runtime handles one message at a time, in the order `receive` returns them, and calls:
///
/// 1. [`start`](Self::start) once;
/// 2. [`receive`](Self::receive) for the next message;
/// 3. while that message waits between attempts (an outage, a retry, an event version newer
///    than the handler knows, a dead letter the broker refuses): [`pause`](Self::pause), then
///    `receive` again so the client stays alive; what still arrives is kept in order, handled
///    next, and [`pause_source_of`](Self::pause_source_of) is called for it;
/// 4. [`acknowledge`](Self::acknowledge) once the message is done (its handler's
///    transaction committed, the inbox recognised it, it was dead-lettered or skipped), never
///    before; then [`resume`](Self::resume);
/// 5. [`dead_letter`](Self::dead_letter) to write a dead letter, retried until it succeeds;
/// 6. [`close`](Self::close) on shutdown. A message not acknowledged by then is delivered
///    again later; the handler's inbox makes that a duplicate.
///
/// How brokers map onto it:
///
/// | | Kafka | NATS JetStream (pull) | RabbitMQ |
/// |---|---|---|---|
/// | `acknowledge` | store the offset for the next commit | `ack` (per message) | `basic.ack` of the delivery tag |
/// | `pause` | pause the assigned partitions | stop fetching; keep the message's ack deadline alive (`in_progress`) | stop taking deliveries (prefetch bounds them) |
/// | `dead_letter` | produce to the dead-letter topic | publish to the dead-letter subject, then `term` | publish to the dead-letter exchange, then `basic.ack` (or `basic.nack` without requeue with a DLX) |
/// | `close` | commit the stored offsets, leave the group | drain; unacknowledged messages are redelivered after `ack_wait` | cancel the consumer; unacknowledged deliveries are requeued |
///
/// Per-key order needs one message in flight per key: Kafka has it per partition; a
/// JetStream consumer needs `max_ack_pending = 1` (or a subject per key and one consumer per
/// subject filter); a RabbitMQ queue needs a single active consumer and `prefetch = 1`, or a
/// consistent-hash exchange with one queue per consumer. A broker that redelivers on its own
/// (`nak` with a delay, `basic.nack` with requeue) must not be used for retries: the runtime
/// holds the message itself, so that the key's later messages wait behind it.
pub(crate) trait Transport: Send + 'static {
    /// The messages it delivers.
    type Message: Received;
    /// What `receive` and `acknowledge` fail with (logged, then retried).
    type Error: std::fmt::Display + Send;

    /// The broker's name in log lines, e.g. `Kafka`.
    const BROKER: &'static str;
    /// The OpenTelemetry `messaging.system`, e.g. `kafka`.
    const SYSTEM: &'static str;

    /// Subscribes (or binds, or assigns) and logs that the consumer started.
    fn start(&mut self) -> impl Future<Output = ()> + Send;

    /// The next message. Cancel-safe: dropping the future loses no message.
    fn receive(&self) -> impl Future<Output = Result<Self::Message, Self::Error>> + Send;

    /// Stops delivery of new messages while one waits (idempotent).
    fn pause(&mut self);

    /// A message arrived while paused (a source assigned meanwhile): pause its source too.
    fn pause_source_of(&mut self, message: &Self::Message);

    /// Undoes [`pause`](Self::pause), once the waiting message is done; a no-op if not paused.
    fn resume(&mut self);

    /// The message is done: it must not be delivered to this consumer again.
    fn acknowledge(
        &self,
        message: &Self::Message,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Writes `letter`; `Ok` with where it went once the broker confirmed it.
    fn dead_letter(
        &self,
        letter: &DeadLetter<'_>,
    ) -> impl Future<Output = Result<String, Unwritten>> + Send;

    /// Commits what was acknowledged and leaves (the group, the connection).
    fn close(self) -> impl Future<Output = ()> + Send;
}
