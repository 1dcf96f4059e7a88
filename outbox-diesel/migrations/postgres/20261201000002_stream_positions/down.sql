DROP TABLE IF EXISTS outbox_stream_positions;
DROP INDEX IF EXISTS outbox_events_stream;
ALTER TABLE outbox_events DROP COLUMN IF EXISTS xid;
