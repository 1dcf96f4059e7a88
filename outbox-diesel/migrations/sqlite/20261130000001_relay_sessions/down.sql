ALTER TABLE outbox_relays DROP COLUMN last_error;
ALTER TABLE outbox_relays DROP COLUMN state_since;
ALTER TABLE outbox_relays DROP COLUMN state;
ALTER TABLE outbox_relays DROP COLUMN mode;
