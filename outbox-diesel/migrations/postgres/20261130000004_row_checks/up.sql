-- The database refuses rows the relay cannot publish faithfully: an empty aggregate type, id
-- (the Kafka key) or event type, and headers that are not a JSON object of strings (Kafka
-- headers are name/value strings; anything else would be dropped on the way).
--
-- Existing rows: pending ones that break a rule are dead-lettered first (never published with
-- fields dropped; `outbox status` shows them, `last_error` says why), then the constraints are
-- added NOT VALID: new and updated rows are checked at once, and the migration never fails on,
-- nor scans, a large existing table. Once no old violating row is left (retention deletes
-- published rows), `ALTER TABLE outbox_events VALIDATE CONSTRAINT <name>` marks each one
-- valid without blocking writers.
LOCK TABLE outbox_events IN SHARE ROW EXCLUSIVE MODE;

UPDATE outbox_events
SET dead_at = now(), locked_by = NULL, locked_until = NULL,
    last_error = 'refused by migration row_checks: ' || CASE
        WHEN aggregate_type = '' THEN 'empty aggregate_type'
        WHEN aggregate_id = '' THEN 'empty aggregate_id'
        WHEN event_type = '' THEN 'empty event_type'
        ELSE 'headers are not a JSON object of string values' END
WHERE published_at IS NULL AND dead_at IS NULL
  AND (aggregate_type = '' OR aggregate_id = '' OR event_type = ''
       OR jsonb_typeof(headers) <> 'object'
       OR jsonb_path_exists(headers, '$.* ? (@.type() != "string")'));

ALTER TABLE outbox_events
    ADD CONSTRAINT outbox_events_aggregate_type_nonempty CHECK (aggregate_type <> '') NOT VALID,
    ADD CONSTRAINT outbox_events_aggregate_id_nonempty CHECK (aggregate_id <> '') NOT VALID,
    ADD CONSTRAINT outbox_events_event_type_nonempty CHECK (event_type <> '') NOT VALID,
    ADD CONSTRAINT outbox_events_headers_string_object CHECK (
        jsonb_typeof(headers) = 'object'
        AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")')
    ) NOT VALID;
