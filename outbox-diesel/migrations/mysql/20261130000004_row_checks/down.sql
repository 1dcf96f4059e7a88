ALTER TABLE outbox_events
    DROP CONSTRAINT outbox_events_headers_string_object,
    DROP CONSTRAINT outbox_events_event_type_nonempty,
    DROP CONSTRAINT outbox_events_aggregate_id_nonempty,
    DROP CONSTRAINT outbox_events_aggregate_type_nonempty;
