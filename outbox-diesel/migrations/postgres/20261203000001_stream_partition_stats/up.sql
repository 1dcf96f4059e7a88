-- A partition of the ring (outbox_partition_events) that holds rows but has no statistics is
-- planned as if it held almost none. It has none while it has not been analysed since it
-- first held rows: every partition empty at the conversion (its ANALYZE samples nothing), until
-- autovacuum's first ANALYZE of it, a naptime (a minute) or more after writers reach its slot.
-- With no null fraction for published_at and dead_at, PostgreSQL's guess for `IS NULL` (0.005
-- each) makes every pending partial index look empty, and the stream statements' per-shard
-- probes were planned as a walk of a lease-mode index filtered by shard instead of a range of
-- the stream index: measured with `outbox-bench --only soak` (1,000 events/s, ring 4 x
-- 500,000, auto_explain), POSITIONS took 3.0 s with 13,798 rows in the partition (2.2 million
-- buffers, 256 walks of it), then 5.6 s, then ran into the relay's statement timeout; the
-- relay fell 25,000 events behind, until autovacuum analysed the partition 80 s in. TRUNCATE
-- keeps a partition's statistics, so this happens once per partition, in the ring's first
-- turn.
--
-- This analyses such partitions at once: those holding at least 8 pages (a few hundred rows)
-- with no statistics for published_at. Stream relays call it every second (`STATS_CHECK` in
-- outbox-diesel/src/relay/pg/stream.rs): a query of the catalogue, and an ANALYZE (30,000
-- sampled rows at most) once per partition. ANALYZE takes SHARE UPDATE EXCLUSIVE on the
-- partition (writers and readers go on; it waits for autovacuum or a rotation there, for at
-- most `lock_wait`, else the partition is left for the next call). A role that does not own
-- the table is refused by ANALYZE with a warning, and the partition waits for autovacuum.
-- Returns how many partitions gained statistics; 0 on a table that is not partitioned.
-- Whether a table has statistics (for published_at, which every stream statement filters on).
CREATE FUNCTION outbox_has_statistics(part regclass) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (SELECT 1 FROM pg_stats s
                   JOIN pg_class c ON c.relname = s.tablename
                   JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname
                   WHERE c.oid = part AND s.attname = 'published_at')
$fn$;

CREATE FUNCTION outbox_analyze_partitions(lock_wait interval) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    cfg   record;
    part  regclass;
    done  integer := 0;
    saved text := current_setting('lock_timeout');
BEGIN
    SELECT * INTO cfg FROM outbox_stream_partitioning;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR k IN 0 .. cfg.slots - 1 LOOP
        part := ('outbox_events_slot_' || k)::regclass;
        CONTINUE WHEN pg_relation_size(part) < 8 * current_setting('block_size')::bigint
            OR outbox_has_statistics(part);
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
            EXECUTE format('ANALYZE %s', part);
            -- Counted where it took: ANALYZE skips, with a warning, a table its role does not own.
            IF outbox_has_statistics(part) THEN
                done := done + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', saved, true);
    END LOOP;
    RETURN done;
END
$fn$;
