-- The service's own table, as its Diesel migration creates it (the same on every backend).
CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL);
