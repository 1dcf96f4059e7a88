DROP FUNCTION IF EXISTS outbox_analyze_partitions(interval);
