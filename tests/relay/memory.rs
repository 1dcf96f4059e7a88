//! The memory store: the same store contract as the SQL stores (`store_suite.rs`), so that
//! the relay's logic, tested on it, is tested against the rules the databases keep. The
//! contract's SQL-only points (malformed rows written by other programs, missing tables,
//! statements blocked by another connection's locks) are listed there.

use crate::backends::Memory;

crate::contract_suite!(Memory);
