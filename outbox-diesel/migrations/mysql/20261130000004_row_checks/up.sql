-- The database refuses rows the relay cannot publish faithfully: an empty aggregate type, id
-- (the Kafka key) or event type, and headers that are not a JSON object of strings (Kafka
-- headers are name/value strings; anything else would be dropped on the way).
--
-- Headers: MariaDB stores JSON as LONGTEXT checked by JSON_VALID, and allows no subquery in a
-- CHECK (no JSON_TABLE over the members), so the values are checked on the text: given valid
-- JSON, this pattern matches exactly an object whose members are all string-valued (a string
-- is `"`, then characters other than `"` and `\` or escapes, then `"`). MySQL 8 checks its
-- canonical text of the JSON value the same way. Possessive quantifiers keep PCRE from
-- backtracking on long values.
--
-- Existing rows: pending ones that break a rule are dead-lettered first (never published with
-- fields dropped; `last_error` says why). MariaDB then adds the constraints without checking
-- old rows (`check_constraint_checks = 0`, in a MariaDB-only comment), so a large table is
-- not scanned and published rows from before do not fail the migration; MySQL 8 checks
-- existing rows when a CHECK is added and fails, naming the constraint, if an old published
-- row breaks it (delete or fix that row, then migrate again).
UPDATE outbox_events
SET dead_at = UTC_TIMESTAMP(6), locked_by = NULL, locked_until = NULL,
    last_error = CONCAT('refused by migration row_checks: ', CASE
        WHEN aggregate_type = '' THEN 'empty aggregate_type'
        WHEN aggregate_id = '' THEN 'empty aggregate_id'
        WHEN event_type = '' THEN 'empty event_type'
        ELSE 'headers are not a JSON object of string values' END)
WHERE published_at IS NULL AND dead_at IS NULL
  AND (aggregate_type = '' OR aggregate_id = '' OR event_type = ''
       OR NOT (JSON_TYPE(headers) = 'OBJECT'
               AND headers REGEXP '^[[:space:]]*[{][[:space:]]*("(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*:[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*(,[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*:[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*)*+)?[}][[:space:]]*$'));

/*M! SET @outbox_saved_checks = @@check_constraint_checks, check_constraint_checks = 0 */;
ALTER TABLE outbox_events
    ADD CONSTRAINT outbox_events_aggregate_type_nonempty CHECK (aggregate_type <> ''),
    ADD CONSTRAINT outbox_events_aggregate_id_nonempty CHECK (aggregate_id <> ''),
    ADD CONSTRAINT outbox_events_event_type_nonempty CHECK (event_type <> ''),
    ADD CONSTRAINT outbox_events_headers_string_object CHECK (
        JSON_TYPE(headers) = 'OBJECT'
        AND headers REGEXP '^[[:space:]]*[{][[:space:]]*("(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*:[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*(,[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*:[[:space:]]*"(?:[^"\\\\]++|\\\\.)*+"[[:space:]]*)*+)?[}][[:space:]]*$'
    );
/*M! SET check_constraint_checks = @outbox_saved_checks */;
