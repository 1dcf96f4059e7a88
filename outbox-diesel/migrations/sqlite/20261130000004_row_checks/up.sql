-- The database refuses rows the relay cannot publish faithfully: an empty aggregate type, id
-- (the Kafka key) or event type, and headers that are not a JSON object of strings (Kafka
-- headers are name/value strings; anything else would be dropped on the way).
--
-- SQLite cannot add a CHECK to an existing table (ALTER TABLE has no ADD CONSTRAINT; the
-- table would have to be rebuilt), and a CHECK may not hold the subquery over json_each that
-- checks each header value. So a BEFORE INSERT trigger refuses such rows, with the message
-- SQLite gives a failed CHECK, naming the rule. It checks inserts only: rows already stored
-- are never refused an UPDATE (a claim, a mark, a retry); pending ones that break a rule are
-- dead-lettered here instead (never published with fields dropped; `last_error` says why).
UPDATE outbox_events
SET dead_at = strftime('%Y-%m-%d %H:%M:%f000', 'now'), locked_by = NULL, locked_until = NULL,
    last_error = 'refused by migration row_checks: ' || CASE
        WHEN aggregate_type = '' THEN 'empty aggregate_type'
        WHEN aggregate_id = '' THEN 'empty aggregate_id'
        WHEN event_type = '' THEN 'empty event_type'
        ELSE 'headers are not a JSON object of string values' END
WHERE published_at IS NULL AND dead_at IS NULL
  AND (aggregate_type = '' OR aggregate_id = '' OR event_type = ''
       OR json_type(headers) IS NOT 'object'
       OR EXISTS (SELECT 1 FROM json_each(outbox_events.headers) WHERE type <> 'text'));

CREATE TRIGGER outbox_events_row_checks BEFORE INSERT ON outbox_events
BEGIN
    SELECT RAISE(ABORT, 'CHECK constraint failed: outbox_events_aggregate_type_nonempty')
        WHERE NEW.aggregate_type = '';
    SELECT RAISE(ABORT, 'CHECK constraint failed: outbox_events_aggregate_id_nonempty')
        WHERE NEW.aggregate_id = '';
    SELECT RAISE(ABORT, 'CHECK constraint failed: outbox_events_event_type_nonempty')
        WHERE NEW.event_type = '';
    -- Invalid JSON is left to the column's json_valid CHECK.
    SELECT RAISE(ABORT, 'CHECK constraint failed: outbox_events_headers_string_object')
        WHERE CASE WHEN json_valid(NEW.headers)
                   THEN json_type(NEW.headers) IS NOT 'object'
                        OR EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text')
                   ELSE 0 END;
END;
