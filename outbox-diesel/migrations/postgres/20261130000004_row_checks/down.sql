ALTER TABLE outbox_events
    DROP CONSTRAINT IF EXISTS outbox_events_headers_string_object,
    DROP CONSTRAINT IF EXISTS outbox_events_event_type_nonempty,
    DROP CONSTRAINT IF EXISTS outbox_events_aggregate_id_nonempty,
    DROP CONSTRAINT IF EXISTS outbox_events_aggregate_type_nonempty;
