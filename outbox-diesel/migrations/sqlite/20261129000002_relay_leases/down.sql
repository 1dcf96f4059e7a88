DROP INDEX IF EXISTS outbox_events_published;
DROP INDEX IF EXISTS outbox_events_dead_aggregate;
DROP TABLE IF EXISTS outbox_leader;
DROP TABLE IF EXISTS outbox_relays;
DROP TABLE IF EXISTS outbox_shard_leases;
