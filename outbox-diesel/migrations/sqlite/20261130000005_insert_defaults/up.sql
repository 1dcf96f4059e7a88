-- Rows from other programs get an `id` (a UUIDv7), `created_at` and `available_at` when the
-- INSERT leaves them out; `headers` already defaults to '{}'.
--
-- SQLite cannot change a column's default without rebuilding the table, and a BEFORE trigger
-- cannot assign to NEW. So this trigger, for a row that lacks one of those columns, inserts a
-- completed copy and drops the original (RAISE(IGNORE)); rows that have them all (ours)
-- only evaluate the WHEN clause. SQLite has no function for the shard (no user functions in
-- plain SQL, and no CTE in a trigger to loop over the bytes): writers outside Rust give
-- `shard` themselves (FNV-1a-32 of type, 0xFF, id, mod 256; see outbox_core::shard_of), and a
-- row without one is refused with a message that says so.
CREATE TRIGGER outbox_events_fill BEFORE INSERT ON outbox_events
WHEN NEW.id IS NULL OR NEW.shard IS NULL OR NEW.created_at IS NULL OR NEW.available_at IS NULL
BEGIN
    SELECT RAISE(ABORT, 'outbox_events.shard is required on SQLite: compute it with outbox::shard_of (FNV-1a-32 of aggregate_type, 0xFF, aggregate_id, mod 256)')
        WHERE NEW.shard IS NULL;
    INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, event_version,
        payload, headers, topic, shard, created_at, available_at, attempts, locked_by,
        locked_until, published_at, dead_at, last_error)
    VALUES (
        coalesce(NEW.id, lower(
            substr(printf('%012x', CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)), 1, 8)
            || '-' || substr(printf('%012x', CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)), 9, 4)
            || '-7' || substr(hex(randomblob(2)), 2, 3)
            || '-' || substr('89ab', 1 + abs(random() % 4), 1) || substr(hex(randomblob(2)), 2, 3)
            || '-' || hex(randomblob(6)))),
        NEW.aggregate_type, NEW.aggregate_id, NEW.event_type, NEW.event_version,
        NEW.payload, NEW.headers, NEW.topic, NEW.shard,
        coalesce(NEW.created_at, strftime('%Y-%m-%d %H:%M:%f000', 'now')),
        coalesce(NEW.available_at, NEW.created_at, strftime('%Y-%m-%d %H:%M:%f000', 'now')),
        NEW.attempts, NEW.locked_by, NEW.locked_until, NEW.published_at, NEW.dead_at,
        NEW.last_error);
    SELECT RAISE(IGNORE);
END;
