DROP TABLE IF EXISTS outbox_stream_dead_letters;
