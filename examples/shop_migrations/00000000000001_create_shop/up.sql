-- The shop's own tables (the same on PostgreSQL, MySQL/MariaDB and SQLite).
CREATE TABLE orders (id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL);
CREATE TABLE invoices (order_id BIGINT NOT NULL, cents BIGINT NOT NULL);
