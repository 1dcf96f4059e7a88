DROP TRIGGER IF EXISTS outbox_events_fill;
