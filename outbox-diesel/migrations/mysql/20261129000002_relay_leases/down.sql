DROP INDEX outbox_events_dead_aggregate ON outbox_events;
DROP TABLE IF EXISTS outbox_leader;
DROP TABLE IF EXISTS outbox_relays;
DROP TABLE IF EXISTS outbox_shard_leases;
