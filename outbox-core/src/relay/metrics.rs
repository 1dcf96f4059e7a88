//! The metrics the relay and the consumer runtime record through the [`metrics`] facade:
//! install any recorder (the `outbox` binary installs a Prometheus one) and they appear.
//! Without a recorder each is a no-op.

/// Every metric the relay and the consumer runtime record, with its kind and help text:
/// `(name, kind, help)`. The table in `docs/operating.md` ("Metrics and probes") lists the same.
pub const METRICS: &[(&str, &str, &str)] = &[
    ("outbox_relay_claimed_total", "counter", "Rows claimed."),
    (
        "outbox_relay_batches_total",
        "counter",
        "Non-empty batches.",
    ),
    (
        "outbox_relay_published_total",
        "counter",
        "Rows published and marked (or deleted).",
    ),
    (
        "outbox_relay_retried_total",
        "counter",
        "Failed publishes recorded for a retry (poison, counted).",
    ),
    (
        "outbox_relay_dead_lettered_total",
        "counter",
        "Rows dead-lettered.",
    ),
    (
        "outbox_relay_released_total",
        "counter",
        "Rows given back unpublished (not attempted, broker unavailable, shutdown).",
    ),
    (
        "outbox_relay_unavailable_total",
        "counter",
        "Rows the broker could not take during an outage (no attempt counted).",
    ),
    (
        "outbox_relay_publish_errors_total",
        "counter",
        "Messages the Kafka publisher could not deliver, by topic, librdkafka code and class \
         (outage: no attempt counted, e.g. a topic that refuses every record; poison: counted).",
    ),
    (
        "outbox_relay_fenced_total",
        "counter",
        "Rows published after their lease passed to another relay (published again).",
    ),
    (
        "outbox_relay_broker_waits_total",
        "counter",
        "Batches after which the relay waited for the broker.",
    ),
    (
        "outbox_relay_reaped_total",
        "counter",
        "Dead peer relays replaced.",
    ),
    (
        "outbox_relay_store_errors_total",
        "counter",
        "Failed database calls.",
    ),
    (
        "outbox_relay_claim_duration_seconds",
        "histogram",
        "Time to claim a batch.",
    ),
    (
        "outbox_relay_publish_duration_seconds",
        "histogram",
        "Time to publish a batch and get its acknowledgements.",
    ),
    (
        "outbox_relay_mark_duration_seconds",
        "histogram",
        "Time to record a batch's outcomes (mark, fail, release).",
    ),
    (
        "outbox_relay_commit_to_ack_seconds",
        "histogram",
        "From an event's created_at to the broker's acknowledgement.",
    ),
    (
        "outbox_relay_shards",
        "gauge",
        "Shards this relay holds (sharded mode).",
    ),
    (
        "outbox_relay_leader",
        "gauge",
        "1 while this relay is the leader (leader mode).",
    ),
    (
        "outbox_relay_backlog",
        "gauge",
        "Pending events (sampled by `outbox relay --metrics-addr` every 10 s).",
    ),
    (
        "outbox_relay_oldest_pending_age_seconds",
        "gauge",
        "Age of the oldest pending event (sampled).",
    ),
    (
        "outbox_relay_dead_letters",
        "gauge",
        "Dead letters in the outbox (sampled).",
    ),
    (
        "outbox_relay_blocked_aggregates",
        "gauge",
        "Aggregates with a dead letter and later pending events (sampled).",
    ),
    (
        "outbox_relay_stream_open_transaction_seconds",
        "gauge",
        "Stream mode: age of the oldest open transaction its positions wait for, 0 if none (sampled).",
    ),
    (
        "outbox_relay_stream_ring_headroom_xids",
        "gauge",
        "Stream mode on a partition ring: transaction ids before writers reach a partition retention has not emptied (sampled).",
    ),
    (
        "outbox_relay_stream_ring_bytes",
        "gauge",
        "Stream mode on a partition ring: the partitions' size in bytes (sampled).",
    ),
    (
        "outbox_consumer_received_total",
        "counter",
        "Messages read.",
    ),
    (
        "outbox_consumer_applied_total",
        "counter",
        "Messages a handler applied.",
    ),
    (
        "outbox_consumer_duplicate_total",
        "counter",
        "Messages recognised as already applied.",
    ),
    (
        "outbox_consumer_handler_errors_total",
        "counter",
        "Handler attempts failed with poison (counted toward max_attempts).",
    ),
    (
        "outbox_consumer_transient_errors_total",
        "counter",
        "Handler attempts failed with an outage (retried, never dead-lettered).",
    ),
    (
        "outbox_consumer_dead_lettered_total",
        "counter",
        "Messages written to the dead-letter topic (parked ones included).",
    ),
    (
        "outbox_consumer_dead_letter_failures_total",
        "counter",
        "Dead letters the broker did not take, by dead-letter topic and librdkafka code (the \
         message's partition waits, retrying, until one is written).",
    ),
    (
        "outbox_consumer_dead_letter_blocked",
        "gauge",
        "1 while a message waits for its dead letter to be written, else 0.",
    ),
    (
        "outbox_consumer_parked_total",
        "counter",
        "Messages parked behind an earlier dead letter of their key.",
    ),
    (
        "outbox_consumer_skipped_total",
        "counter",
        "Undecodable messages skipped.",
    ),
    (
        "outbox_consumer_done_total",
        "counter",
        "Offsets stored for commit.",
    ),
    (
        "outbox_consumer_handler_duration_seconds",
        "histogram",
        "Time a handler attempt took.",
    ),
    (
        "outbox_consumer_lag_messages",
        "gauge",
        "Messages of a partition not yet done by this consumer (labels topic, partition), from \
         librdkafka's statistics every statistics.interval.ms (5 s).",
    ),
];

/// Describes every metric of [`METRICS`] to the installed recorder (help text and unit), so
/// that an exporter shows them; call it once after installing the recorder.
pub fn describe_metrics() {
    for &(name, kind, help) in METRICS {
        let unit = name.ends_with("_seconds").then_some(metrics::Unit::Seconds);
        match (kind, unit) {
            ("counter", _) => metrics::describe_counter!(name, help),
            ("gauge", Some(u)) => metrics::describe_gauge!(name, u, help),
            ("gauge", None) => metrics::describe_gauge!(name, help),
            (_, Some(u)) => metrics::describe_histogram!(name, u, help),
            (_, None) => metrics::describe_histogram!(name, help),
        }
    }
}
