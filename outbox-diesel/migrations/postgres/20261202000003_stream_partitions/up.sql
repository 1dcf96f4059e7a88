-- Retention without VACUUM for stream mode (PostgreSQL only): the event table can be turned
-- into a ring of partitions that are emptied by TRUNCATE once every position is past them and
-- their rows are older than the retention, instead of DELETEd row by row (dead tuples, then
-- VACUUM). Opt-in: nothing changes until `SELECT outbox_partition_events(slots, slot_xids)`
-- (or `outbox partition`) converts the table; this migration only adds the functions.
--
-- The layout: `outbox_events` partitioned BY LIST (slot), one partition per slot
-- (`outbox_events_slot_<k>`), and `slot` defaults to (writer's xid / slot_xids) % slots. So a
-- transaction's rows share one slot (savepoints too: pg_current_xact_id() is the top-level
-- xid), consecutive transactions fill one slot for `slot_xids` transaction ids, then the next,
-- and after `slots * slot_xids` ids the first again. Why not ranges of xid or of time:
--   * range partitions need new partitions ahead of the writers. CREATE TABLE ... PARTITION OF
--     takes ACCESS EXCLUSIVE on the parent (measured on PostgreSQL 15: pg_locks during the
--     statement), so it waits for every open writer and queues every new one behind it; ATTACH
--     takes only SHARE UPDATE EXCLUSIVE but ACCESS EXCLUSIVE on the DEFAULT partition, and a
--     DEFAULT partition (the only thing that keeps writers from failing when no relay created
--     the next range in time) forbids DETACH ... CONCURRENTLY, so dropping an old range would
--     take ACCESS EXCLUSIVE on the parent again. A ring needs no DDL after the conversion: the
--     slots exist forever, writers never miss a partition, and rotation is a TRUNCATE of one
--     partition (ACCESS EXCLUSIVE on that partition only; writers insert into another one).
--   * time slots (now() / period) would not bound a slot's xids (a transaction gets its xid at
--     its first write, not at its start), and the check below works on xids.
-- Uniqueness: a partitioned table's unique constraints must include the partition key, so
-- `id` is unique per slot (UNIQUE (id, slot)); a transaction's rows, and so the rows the
-- nested-transaction writer may write twice (`ON CONFLICT DO NOTHING`), share a slot. Ids the
-- library makes (UUIDv7) do not repeat; an id set by hand and written again by a later
-- transaction in another slot is stored twice (consumers' inbox applies it once). `seq` keeps
-- its identity (on the parent) and an index, no longer a unique one.
CREATE TABLE outbox_stream_partitioning (
    one            BOOLEAN     PRIMARY KEY DEFAULT true CHECK (one),
    slots          INTEGER     NOT NULL CHECK (slots BETWEEN 2 AND 64),
    slot_xids      BIGINT      NOT NULL CHECK (slot_xids >= 1),
    partitioned_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Converts outbox_events into `slots` partitions of `slot_xids` transaction ids each. Under an
-- ACCESS EXCLUSIVE lock on the table for the whole conversion (writers wait; it copies every
-- row, so convert at install or after a cleanup): the table is renamed, a partitioned twin is
-- created with the same columns, defaults, checks, indexes (but the two unique ones) and
-- trigger, every row is copied with its seq, id and xid (so positions, leases and dead letters
-- stay valid), the identity continues from the old one, and the old table is dropped. Returns
-- the number of rows copied.
CREATE FUNCTION outbox_partition_events(slots integer, slot_xids bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    old     regclass;
    cols    text;
    moved   bigint;
    last    bigint;
    idx     record;
    formula text := format('((pg_current_xact_id()::text::bigint / %s) %% %s)::smallint',
                           slot_xids, slots);
BEGIN
    IF slots IS NULL OR slots < 2 OR slots > 64 THEN
        RAISE EXCEPTION 'outbox_partition_events: slots must be between 2 and 64, got %', slots
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF slot_xids IS NULL OR slot_xids < 1 THEN
        RAISE EXCEPTION 'outbox_partition_events: slot_xids must be at least 1, got %', slot_xids
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM outbox_stream_partitioning)
       OR (SELECT relkind FROM pg_class WHERE oid = 'outbox_events'::regclass) = 'p' THEN
        RAISE EXCEPTION 'outbox_partition_events: outbox_events is already partitioned'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    ALTER TABLE outbox_events RENAME TO outbox_events_unpartitioned;
    old := 'outbox_events_unpartitioned'::regclass;
    FOR idx IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = old LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.relname, idx.relname || '_unpartitioned');
    END LOOP;
    FOR idx IN SELECT conname FROM pg_constraint WHERE conrelid = old AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE outbox_events_unpartitioned RENAME CONSTRAINT %I TO %I',
                       idx.conname, idx.conname || '_unpartitioned');
    END LOOP;
    ALTER TABLE outbox_events_unpartitioned ADD COLUMN slot smallint;

    -- Columns in the same order, with their defaults, NOT NULLs, identity (a new sequence) and
    -- CHECKs (under their own names again; the copy below checks every row against them).
    CREATE TABLE outbox_events (LIKE outbox_events_unpartitioned
        INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS)
        PARTITION BY LIST (slot);
    FOR idx IN SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
               WHERE conrelid = old AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE outbox_events ADD CONSTRAINT %I %s',
                       left(idx.conname, length(idx.conname) - length('_unpartitioned')),
                       replace(idx.def, ' NOT VALID', ''));
    END LOOP;
    EXECUTE format('ALTER TABLE outbox_events ALTER COLUMN slot SET DEFAULT %s, ALTER COLUMN slot SET NOT NULL',
                   formula);
    ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_id_slot_key UNIQUE (id, slot);
    CREATE INDEX outbox_events_seq ON outbox_events (seq);
    -- Every other index, as it was (the partial pending, shard, dead, published and stream
    -- indexes): the unique ones on seq and id cannot exist on a partitioned table.
    FOR idx IN SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
               FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = old AND NOT i.indisunique LOOP
        EXECUTE regexp_replace(
            replace(idx.def, idx.relname, left(idx.relname, length(idx.relname) - length('_unpartitioned'))),
            ' ON (ONLY )?\S+ USING ', ' ON outbox_events USING ');
    END LOOP;
    -- Stream mode never updates a row, so a partition's pages are filled (the lease modes'
    -- fillfactor 50 is for their HOT claims; they still work on this layout, with non-HOT
    -- claims).
    FOR i IN 0 .. slots - 1 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF outbox_events FOR VALUES IN (%s)',
                       'outbox_events_slot_' || i, i);
    END LOOP;
    DROP TRIGGER IF EXISTS outbox_events_fill_shard ON outbox_events_unpartitioned;
    CREATE TRIGGER outbox_events_fill_shard
        BEFORE INSERT ON outbox_events
        FOR EACH ROW WHEN (NEW.shard IS NULL)
        EXECUTE FUNCTION outbox_events_fill_shard();

    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols
    FROM pg_attribute WHERE attrelid = old AND attnum > 0 AND NOT attisdropped AND attname <> 'slot';
    EXECUTE format('INSERT INTO outbox_events (%s, slot) OVERRIDING SYSTEM VALUE '
                   'SELECT %s, ((xid::text::bigint / %s) %% %s)::smallint FROM outbox_events_unpartitioned',
                   cols, cols, slot_xids, slots);
    GET DIAGNOSTICS moved = ROW_COUNT;
    SELECT greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox_events_unpartitioned', 'seq')), 0),
                    coalesce((SELECT max(seq) FROM outbox_events_unpartitioned), 0))
        INTO last;
    IF last > 0 THEN
        PERFORM setval(pg_get_serial_sequence('outbox_events', 'seq'), last);
    END IF;
    DROP TABLE outbox_events_unpartitioned;
    INSERT INTO outbox_stream_partitioning (slots, slot_xids)
        VALUES (outbox_partition_events.slots, outbox_partition_events.slot_xids);
    ANALYZE outbox_events;
    RETURN moved;
END
$fn$;

-- Whether every row of one slot's partition may go (all of them, else none): every stream row
-- there is visible both in its shard's position (`last_snapshot`: published, or passed as a
-- dead letter or parked event, which are copies) and in `bound` (the newest tick at least the
-- retention old: committed before it), no lease-mode dead letter is there, and nothing a lease
-- mode published within `keep`. Per shard a range scan of the partition's stream index from
-- the lower of the two snapshots' xmin (below it every transaction is over, and a committed
-- one is visible in both): a probe that finds nothing, unless a transaction was open at one of
-- the snapshots; then the rows committed since it began are read and checked one by one.
CREATE FUNCTION outbox_slot_passed(part regclass, bound pg_snapshot, keep interval) RETURNS boolean
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    ok boolean;
BEGIN
    EXECUTE format($q$
        SELECT NOT EXISTS (
                   SELECT 1 FROM outbox_stream_positions p CROSS JOIN LATERAL (
                       SELECT 1 FROM %1$s o
                       WHERE o.shard = p.shard AND o.published_at IS NULL AND o.dead_at IS NULL
                         AND o.xid >= least(pg_snapshot_xmin(p.last_snapshot), pg_snapshot_xmin($1))
                         AND NOT (pg_visible_in_snapshot(o.xid, p.last_snapshot)
                                  AND pg_visible_in_snapshot(o.xid, $1))
                       LIMIT 1) m)
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE dead_at IS NOT NULL AND published_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM %1$s WHERE published_at IS NOT NULL
                                                   AND published_at >= now() - $2)
        $q$, part) USING bound, keep INTO ok;
    RETURN ok;
END
$fn$;

-- Empties at most one slot's partition whose rows may all go (outbox_slot_passed), and
-- returns it with the bytes it held; nothing when none may, or the table is not partitioned.
-- The check runs first without a lock, then again under ACCESS EXCLUSIVE on the partition
-- (taken within `lock_wait`, else the partition is skipped this time): no other transaction
-- then has rows there it has not committed (an insert holds ROW EXCLUSIVE on its partition
-- until it ends), so what the check saw is everything the TRUNCATE removes. A writer that
-- routes a row there meanwhile (its xid reached the slot again) waits for the lock and
-- inserts into the emptied partition. Readers of the parent (relays' claims) lock every
-- partition ACCESS SHARE, so they wait for the TRUNCATE too, for at most `lock_wait`
-- while it waits for them plus the TRUNCATE itself.
CREATE FUNCTION outbox_rotate_partitions(keep interval, lock_wait interval)
RETURNS TABLE (slot integer, bytes bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg   record;
    bound pg_snapshot;
    part  regclass;
    size  bigint;
    saved text := current_setting('lock_timeout');
BEGIN
    SELECT * INTO cfg FROM outbox_stream_partitioning;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT t.snapshot INTO bound FROM outbox_stream_ticks t
    WHERE t.tick_at <= now() - keep ORDER BY t.tick_at DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR k IN 0 .. cfg.slots - 1 LOOP
        part := ('outbox_events_slot_' || k)::regclass;
        size := pg_total_relation_size(part);
        CONTINUE WHEN pg_relation_size(part) = 0 OR NOT outbox_slot_passed(part, bound, keep);
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
            EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', saved, true);
            CONTINUE;
        END;
        PERFORM set_config('lock_timeout', saved, true);
        CONTINUE WHEN NOT outbox_slot_passed(part, bound, keep);
        EXECUTE format('TRUNCATE %s', part);
        slot := k;
        bytes := size;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$fn$;
