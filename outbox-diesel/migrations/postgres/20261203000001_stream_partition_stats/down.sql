DROP FUNCTION IF EXISTS outbox_analyze_partitions(interval);
DROP FUNCTION IF EXISTS outbox_has_statistics(regclass);
