ALTER TABLE outbox_events RESET (fillfactor);
CREATE INDEX IF NOT EXISTS outbox_events_inflight_aggregate ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE published_at IS NULL AND dead_at IS NULL
      AND (locked_by IS NOT NULL OR attempts > 0 OR available_at > created_at);
