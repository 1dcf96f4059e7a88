DROP TABLE IF EXISTS outbox_inbox;
DROP TABLE IF EXISTS outbox_events;
