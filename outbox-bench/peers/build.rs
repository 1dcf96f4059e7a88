//! Records the resolved versions of the peer crates (from Cargo.lock) for the report.

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    for (krate, var) in [
        ("outbox-core", "PEER_OXIDE_CORE"),
        ("outbox-postgres", "PEER_OXIDE_POSTGRES"),
        ("outbox-kafka", "PEER_OXIDE_KAFKA"),
        ("ruststream", "PEER_RUSTSTREAM"),
        ("ruststream-sqlx", "PEER_RUSTSTREAM_SQLX"),
        ("ruststream-rdkafka", "PEER_RUSTSTREAM_RDKAFKA"),
        ("rdkafka", "PEER_RDKAFKA"),
    ] {
        let version = version_of(&lock, krate).unwrap_or_else(|| "?".into());
        println!("cargo:rustc-env={var}={version}");
    }
}

/// The version of the registry package `name` in `lock` (the first one, if several).
fn version_of(lock: &str, name: &str) -> Option<String> {
    let needle = format!("name = \"{name}\"\nversion = \"");
    let at = lock.find(&needle)? + needle.len();
    let end = lock[at..].find('"')?;
    Some(lock[at..at + end].to_string())
}
