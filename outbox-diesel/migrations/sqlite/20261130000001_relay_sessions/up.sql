-- Every relay heartbeats a row here with its health, shown by `outbox status`. SQLite has
-- no sessions to watch: its single relay is replaced only when its lease runs out.
ALTER TABLE outbox_relays ADD COLUMN mode TEXT NOT NULL DEFAULT 'sharded';
ALTER TABLE outbox_relays ADD COLUMN state TEXT NOT NULL DEFAULT 'running';
ALTER TABLE outbox_relays ADD COLUMN state_since TEXT;
ALTER TABLE outbox_relays ADD COLUMN last_error TEXT;
