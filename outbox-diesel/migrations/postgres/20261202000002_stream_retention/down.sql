DROP TABLE IF EXISTS outbox_stream_ticks;
