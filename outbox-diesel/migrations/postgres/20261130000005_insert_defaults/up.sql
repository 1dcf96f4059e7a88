-- Rows from other programs (psql, a service in another language) need only the event's own
-- columns:
--   INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, event_version, payload)
--   VALUES ('order', '42', 'OrderPlaced', 1, '{"total_cents": 1250}');
-- `id` defaults to a fresh UUIDv7, `shard` is computed by the trigger below, `headers`,
-- `created_at` and `available_at` already have defaults.

-- A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds from clock_timestamp(), then the random
-- bits of a v4 UUID, with the version nibble turned from 4 into 7 (bits 52 and 53); the
-- variant bits of the v4 UUID are already right. PostgreSQL 17 has no uuidv7() (18 has), and
-- this one is the same on every version from 13 on (gen_random_uuid is built in since 13).
CREATE FUNCTION outbox_uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

ALTER TABLE outbox_events ALTER COLUMN id SET DEFAULT outbox_uuid_v7();

-- The shard of an aggregate, exactly as the Rust `outbox_core::shard_of` computes it:
-- FNV-1a-32 over the UTF-8 bytes of the aggregate type, one 0xFF byte, then the UTF-8 bytes of
-- the aggregate id, mod 256. The hash stays below 2^32 and the prime below 2^25, so the
-- product fits a bigint; masking with 2^32 - 1 is the u32 wrap-around.
CREATE FUNCTION outbox_shard_of(aggregate_type text, aggregate_id text) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    bytes bytea := convert_to(aggregate_type, 'UTF8') || '\xff'::bytea || convert_to(aggregate_id, 'UTF8');
    hash bigint := 2166136261;  -- 0x811C9DC5
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        hash := ((hash # get_byte(bytes, i)) * 16777619) & 4294967295;  -- prime 0x01000193
    END LOOP;
    RETURN (hash & 255)::smallint;
END
$$;

-- Fills `shard` when an INSERT leaves it out. PostgreSQL allows no default that reads other
-- columns, and a generated column could not be written by our own INSERT (which gives the
-- shard it computed in Rust), so: a BEFORE INSERT trigger that fires only WHEN the shard is
-- NULL. The WHEN condition is evaluated without calling the function, so our own writes (which
-- always give the shard) never run it; NOT NULL is checked after BEFORE triggers.
-- Measured (PostgreSQL 15, EXPLAIN ANALYZE of a 100,000-row INSERT): rows that give the shard
-- make no trigger call at all (the write path is unchanged, within the noise of repeated
-- runs); rows that leave it out cost 3 µs each in the trigger.
CREATE FUNCTION outbox_events_fill_shard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.shard := outbox_shard_of(NEW.aggregate_type, NEW.aggregate_id);
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_events_fill_shard
    BEFORE INSERT ON outbox_events
    FOR EACH ROW WHEN (NEW.shard IS NULL)
    EXECUTE FUNCTION outbox_events_fill_shard();
