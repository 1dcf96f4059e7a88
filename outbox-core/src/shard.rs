//! The stable shard of an aggregate.

/// Number of virtual shards. Every outbox row stores `shard_of(aggregate_type, aggregate_id)`,
/// a number in `0..SHARD_COUNT`; the sharded relay hands whole shards to relays, so all events of
/// one aggregate go through one relay at a time.
///
/// This number is part of the stored data format: changing it would move aggregates between
/// shards, so it never changes within a major version.
pub const SHARD_COUNT: u16 = 256;

/// The shard of an aggregate: `FNV-1a-32(aggregate_type ‖ 0xFF ‖ aggregate_id) mod 256`.
///
/// FNV-1a with the 32-bit offset basis `0x811C9DC5` and prime `0x01000193`, over the UTF-8
/// bytes of the aggregate type, one `0xFF` byte (which never occurs in UTF-8, so `("ab", "c")`
/// and `("a", "bc")` differ), then the UTF-8 bytes of the aggregate id. It is the same on every
/// platform and version, and is easy to compute in any language, so rows inserted by other
/// programs can carry the right shard.
///
/// ```
/// assert_eq!(outbox_core::shard_of("order", "42"), outbox_core::shard_of("order", "42"));
/// assert!(outbox_core::shard_of("order", "42") < 256);
/// ```
pub fn shard_of(aggregate_type: &str, aggregate_id: &str) -> i16 {
    const OFFSET: u32 = 0x811C_9DC5;
    const PRIME: u32 = 0x0100_0193;
    let mut hash = OFFSET;
    let bytes = aggregate_type
        .as_bytes()
        .iter()
        .chain(std::iter::once(&0xFF))
        .chain(aggregate_id.as_bytes());
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(PRIME);
    }
    // `SHARD_COUNT` fits in i16 and the remainder is below it.
    (hash % u32::from(SHARD_COUNT)) as i16
}

/// `(aggregate_type, aggregate_id, shard)` triples that pin [`shard_of`], computed
/// independently (Python). The SQL functions `outbox_shard_of` of the PostgreSQL and MySQL
/// migrations are tested against the same list: empty parts, the separator, non-ASCII text
/// (bytes above 0x7F), quotes and backslashes, and the longest id a MySQL column holds.
#[doc(hidden)]
pub const SHARD_TEST_VECTORS: &[(&str, &str, i16)] = &[
    ("", "", 78),
    ("order", "1", 171),
    ("order", "42", 98),
    ("order", "0190f1c2-7b5e-7c3a-8d2e-3f4a5b6c7d8e", 32),
    ("ab", "c", 228),
    ("a", "bc", 118),
    ("Bestellung", "Straße-7", 158),
    ("注文", "顧客-😀", 244),
    ("order", "", 184),
    ("", "order", 198),
    ("customer", LONG_ID, 158),
    ("o'rder", "a\\b\"c", 67),
];

/// 255 × `x`: the longest aggregate id of the MySQL schema.
const LONG_ID: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned values, computed independently (Python, see the module docs): if one of these
    /// changes, stored rows would land in other shards.
    #[test]
    fn shard_values_are_stable() {
        assert_eq!(fnv("", ""), 0x7A0B_824E);
        assert_eq!(shard_of("", ""), 78);
        assert_eq!(shard_of("order", "1"), 171);
        assert_eq!(shard_of("order", "42"), 98);
        assert_eq!(
            shard_of("order", "0190f1c2-7b5e-7c3a-8d2e-3f4a5b6c7d8e"),
            32
        );
        assert_ne!(fnv("ab", "c"), fnv("a", "bc"));
        assert_eq!(LONG_ID.len(), 255);
        for &(t, id, shard) in SHARD_TEST_VECTORS {
            assert_eq!(shard_of(t, id), shard, "shard_of({t:?}, {id:?})");
            assert_eq!((fnv(t, id) % 256) as i16, shard, "fnv({t:?}, {id:?})");
        }
    }

    fn fnv(t: &str, id: &str) -> u32 {
        let mut h: u32 = 0x811C_9DC5;
        for b in t.bytes().chain([0xFF]).chain(id.bytes()) {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        h
    }

    #[test]
    fn shards_spread() {
        let mut seen = [0u32; 256];
        for i in 0..25_600 {
            seen[shard_of("order", &i.to_string()) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50 && n < 200), "{seen:?}");
    }
}
