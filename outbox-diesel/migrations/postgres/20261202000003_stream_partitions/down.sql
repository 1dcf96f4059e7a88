DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_stream_partitioning) THEN
        RAISE EXCEPTION 'outbox_events is partitioned (outbox_partition_events): this migration cannot be reverted on it';
    END IF;
END
$$;
DROP FUNCTION IF EXISTS outbox_rotate_partitions(interval, interval);
DROP FUNCTION IF EXISTS outbox_slot_passed(regclass, pg_snapshot, interval);
DROP FUNCTION IF EXISTS outbox_partition_events(integer, bigint);
DROP TABLE IF EXISTS outbox_stream_partitioning;
