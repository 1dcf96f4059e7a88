DROP TRIGGER IF EXISTS outbox_events_fill_shard ON outbox_events;
DROP FUNCTION IF EXISTS outbox_events_fill_shard();
DROP FUNCTION IF EXISTS outbox_shard_of(text, text);
ALTER TABLE outbox_events ALTER COLUMN id DROP DEFAULT;
DROP FUNCTION IF EXISTS outbox_uuid_v7();
