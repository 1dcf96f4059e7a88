//! PostgreSQL: the store suite, plus what only PostgreSQL shows (plans, pg_stat_activity).

use crate::backends::Postgres;

crate::store_suite!(Postgres);
