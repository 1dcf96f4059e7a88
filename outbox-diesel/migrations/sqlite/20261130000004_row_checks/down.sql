DROP TRIGGER IF EXISTS outbox_events_row_checks;
