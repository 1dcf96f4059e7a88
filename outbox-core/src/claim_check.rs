//! Claim checks: publish a small event that refers to a large body stored elsewhere.
//!
//! A payload over the publish limit ([`DEFAULT_MAX_PAYLOAD_BYTES`](crate::DEFAULT_MAX_PAYLOAD_BYTES))
//! is refused at `publish`. The alternative is a claim check: store the body in a
//! [`BodyStore`] (a table in the same database, written in the same transaction as the event;
//! object storage; a shared directory), put the returned [`ClaimCheck`] in the event, and let
//! consumers [`fetch`](ClaimCheck::fetch) the body. The check carries the body's size and an
//! FNV-1a checksum, so a consumer that reads a different body (overwritten, truncated) gets an
//! error instead of wrong data.
//!
//! ```
//! use outbox_core::claim_check::{ClaimCheck, DirStore};
//! # let dir = std::env::temp_dir().join(format!("claim-doc-{}", uuid::Uuid::now_v7()));
//! let mut store = DirStore::new(&dir)?;
//! let body = vec![7u8; 5_000_000];
//! let check = ClaimCheck::store(&mut store, &body)?; // put it in the event instead of the body
//! assert_eq!(check.size, 5_000_000);
//! assert_eq!(check.fetch(&mut store)?, body); // the consumer's side
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<_, outbox_core::EventError>(())
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{BoxError, EventError};

/// Where claim-checked bodies live. Implement it for a table (on a wrapper around the
/// connection, so the body commits with its event), object storage, or use [`DirStore`].
pub trait BodyStore {
    /// Stores `body` under `key` (a fresh UUIDv7 string).
    fn put(&mut self, key: &str, body: &[u8]) -> Result<(), BoxError>;
    /// The body stored under `key`, or `None` if there is none.
    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BoxError>;
}

/// The reference an event carries instead of a large body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimCheck {
    /// The body's key in the store.
    pub key: String,
    /// The body's size in bytes.
    pub size: u64,
    /// FNV-1a 64 of the body, 16 hex digits: detects a body that changed, not an attacker.
    pub checksum: String,
}

impl ClaimCheck {
    /// Stores `body` under a fresh key and returns the check to publish.
    pub fn store(store: &mut impl BodyStore, body: &[u8]) -> Result<ClaimCheck, EventError> {
        let key = uuid::Uuid::now_v7().to_string();
        store.put(&key, body).map_err(|e| EventError::ClaimCheck {
            key: key.clone(),
            reason: format!("storing the body failed: {e}"),
        })?;
        Ok(ClaimCheck {
            key,
            size: body.len() as u64,
            checksum: fnv1a64_hex(body),
        })
    }

    /// Fetches the body and checks its size and checksum. Fails with [`EventError::ClaimCheck`] if
    /// the store fails, has no such body, or holds a different one.
    pub fn fetch(&self, store: &mut impl BodyStore) -> Result<Vec<u8>, EventError> {
        let fail = |reason: String| EventError::ClaimCheck {
            key: self.key.clone(),
            reason,
        };
        let body = store
            .get(&self.key)
            .map_err(|e| fail(format!("fetching the body failed: {e}")))?
            .ok_or_else(|| fail("no body is stored under this key".into()))?;
        if body.len() as u64 != self.size || fnv1a64_hex(&body) != self.checksum {
            return Err(fail(format!(
                "the stored body ({} bytes, checksum {}) is not the one checked in ({} bytes, \
                 checksum {})",
                body.len(),
                fnv1a64_hex(&body),
                self.size,
                self.checksum
            )));
        }
        Ok(body)
    }
}

/// A [`BodyStore`] in a directory (a shared volume): one file per body, written to a temporary
/// name and renamed, so a reader never sees half a body. `put` returns only once the body is
/// durable: the file is fsynced before the rename and the directory after it, so a host crash
/// right after the event's transaction commits cannot leave the event without its body.
#[derive(Debug, Clone)]
pub struct DirStore {
    dir: PathBuf,
}

impl DirStore {
    /// A store in `dir`, created if missing.
    pub fn new(dir: impl AsRef<Path>) -> Result<DirStore, EventError> {
        let dir = dir.as_ref().to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| EventError::ClaimCheck {
            key: String::new(),
            reason: format!("cannot create {}: {e}", dir.display()),
        })?;
        Ok(DirStore { dir })
    }

    fn path(&self, key: &str) -> Result<PathBuf, BoxError> {
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(format!("invalid key `{key}`: expected letters, digits and `-`").into());
        }
        Ok(self.dir.join(key))
    }
}

impl BodyStore for DirStore {
    fn put(&mut self, key: &str, body: &[u8]) -> Result<(), BoxError> {
        use std::io::Write;
        let path = self.path(key)?;
        let tmp = self.dir.join(format!(".{key}.tmp"));
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(body)?;
            // The data must be on disk before the rename can make it visible.
            sync(&file, Synced::File)?;
            drop(file);
            std::fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        // The rename is an entry of the directory: durable once the directory is synced.
        sync_dir(&self.dir)?;
        Ok(())
    }

    fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>, BoxError> {
        match std::fs::read(self.path(key)?) {
            Ok(body) => Ok(Some(body)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// What [`sync`] made durable (recorded in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Synced {
    File,
    Dir,
}

#[cfg(test)]
thread_local! {
    static SYNCED: std::cell::RefCell<Vec<Synced>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `fsync` of a body file or of the store's directory.
fn sync(file: &std::fs::File, what: Synced) -> std::io::Result<()> {
    file.sync_all()?;
    #[cfg(test)]
    SYNCED.with(|s| s.borrow_mut().push(what));
    let _ = what;
    Ok(())
}

/// Syncs `dir`'s entries (Unix; elsewhere a directory cannot be opened to sync it, and a
/// rename is made durable by the file system itself, as on NTFS).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    sync(&std::fs::File::open(dir)?, Synced::Dir)?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn fnv1a64_hex(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (DirStore, PathBuf) {
        let dir = std::env::temp_dir().join(format!("claim-test-{}", uuid::Uuid::now_v7()));
        (DirStore::new(&dir).unwrap(), dir)
    }

    #[test]
    fn put_syncs_the_body_then_the_directory() {
        let (mut s, dir) = store();
        SYNCED.with(|synced| synced.borrow_mut().clear());
        s.put("0001", b"body").unwrap();
        let synced = SYNCED.with(|synced| synced.borrow().clone());
        #[cfg(unix)]
        assert_eq!(synced, [Synced::File, Synced::Dir]);
        #[cfg(not(unix))]
        assert_eq!(synced, [Synced::File]);
        assert_eq!(std::fs::read(dir.join("0001")).unwrap(), b"body");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["0001"], "no temporary file is left");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn round_trip_and_missing_and_changed_bodies() {
        let (mut s, dir) = store();
        let check = ClaimCheck::store(&mut s, b"hello").unwrap();
        assert_eq!(check.fetch(&mut s).unwrap(), b"hello");
        // The reference survives the event's JSON.
        let json = serde_json::to_string(&check).unwrap();
        let back: ClaimCheck = serde_json::from_str(&json).unwrap();
        assert_eq!(back, check);

        s.put(&check.key, b"hellO").unwrap();
        let err = check.fetch(&mut s).unwrap_err().to_string();
        assert!(err.contains("is not the one checked in"), "{err}");

        let missing = ClaimCheck {
            key: "0000".into(),
            ..check
        };
        let err = missing.fetch(&mut s).unwrap_err().to_string();
        assert_eq!(err, "claim check `0000`: no body is stored under this key");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn keys_cannot_leave_the_directory() {
        let (mut s, dir) = store();
        assert!(s.get("../etc/passwd").is_err());
        assert!(s.put("a/b", b"x").is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn checksum_is_fnv1a() {
        // Reference values of FNV-1a 64.
        assert_eq!(fnv1a64_hex(b""), "cbf29ce484222325");
        assert_eq!(fnv1a64_hex(b"a"), "af63dc4c8601ec8c");
    }
}
