DROP TRIGGER IF EXISTS outbox_events_fill;
DROP FUNCTION IF EXISTS outbox_shard_of;
DROP FUNCTION IF EXISTS outbox_uuid_v7;
ALTER TABLE outbox_events
    MODIFY headers      JSON        NOT NULL,
    MODIFY created_at   DATETIME(6) NOT NULL,
    MODIFY available_at DATETIME(6) NOT NULL;
