//! TLS files for the NATS and RabbitMQ connections: CA certificates to trust (e.g. a private
//! CA), and a client certificate for mutual TLS. A builder reads and checks them
//! when it builds, so that a missing or malformed file is an error naming the option and the
//! path, never an outage that lasts until someone reads the logs.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS files a builder was given.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    /// `tls_ca_file`: PEM certificates to trust.
    pub(crate) ca: Option<PathBuf>,
    /// `tls_client_cert`: the PEM certificate (with its chain) and its PEM private key.
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// Paths only: a key's path is not a secret, its contents are never read into `Debug`.
impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .finish()
    }
}

/// What is wrong with a TLS file: the builder option, and why (naming the path).
#[derive(Debug)]
pub(crate) struct TlsFileError {
    pub(crate) option: &'static str,
    pub(crate) reason: String,
}

/// The files' contents, checked: each holds what its option says.
#[derive(Clone, Default)]
pub(crate) struct TlsPem {
    /// The CA certificates, PEM.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub(crate) ca: Option<String>,
    /// The client certificate chain and key, PEM.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Whether each part is there, never the contents (a private key).
impl fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Whether any TLS file was given.
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// Reads every file and checks that it holds what its option says.
    pub(crate) fn load(&self) -> Result<TlsPem, TlsFileError> {
        let ca = match &self.ca {
            Some(path) => {
                let pem = read("tls_ca_file", path)?;
                certificates("tls_ca_file", path, &pem)?;
                Some(String::from_utf8(pem).map_err(|_| TlsFileError {
                    option: "tls_ca_file",
                    reason: format!("`{}` is not a PEM file (not text)", path.display()),
                })?)
            }
            None => None,
        };
        let client = match &self.client {
            Some((cert_path, key_path)) => {
                let cert = read("tls_client_cert", cert_path)?;
                certificates("tls_client_cert", cert_path, &cert)?;
                let key = read("tls_client_cert", key_path)?;
                if PrivateKeyDer::from_pem_slice(&key).is_err() {
                    return Err(TlsFileError {
                        option: "tls_client_cert",
                        reason: format!(
                            "`{}` holds no PEM private key (PKCS#8, PKCS#1 or SEC1; an \
                             encrypted key is not supported: decrypt it, e.g. with \
                             `openssl pkey -in KEY -out KEY.pem`)",
                            key_path.display()
                        ),
                    });
                }
                Some((cert, key))
            }
            None => None,
        };
        Ok(TlsPem { ca, client })
    }
}

fn read(option: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        option,
        reason: format!("cannot read `{}`: {e}", path.display()),
    })
}

/// Checks that `pem` holds at least one certificate, and only well-formed ones.
fn certificates(option: &'static str, path: &Path, pem: &[u8]) -> Result<(), TlsFileError> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        if cert.is_err() {
            return Err(TlsFileError {
                option,
                reason: format!("`{}` holds a malformed PEM certificate", path.display()),
            });
        }
        count += 1;
    }
    if count == 0 {
        return Err(TlsFileError {
            option,
            reason: format!(
                "`{}` holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
                path.display()
            ),
        });
    }
    Ok(())
}

/// Expands, inside a NATS or RabbitMQ builder with a `tls: TlsFiles` field, to
/// `tls_ca_file` and `tls_client_cert`. `$builder` is how a doc example gets a builder;
/// `$trust` says which roots are trusted with the file; `$when` says when the connection
/// uses TLS.
macro_rules! tls_methods {
    ($builder:literal, $trust:literal, $when:literal) => {
        /// Trusts the CA certificates of this PEM file, e.g. a private CA that signed the
        /// broker's certificate; the broker's host name (or IP address) must match its
        /// certificate.
        #[doc = $trust]
        #[doc = $when]
        /// [`build`](Self::build) reads the file and refuses one that holds no certificate.
        ///
        /// ```
        #[doc = concat!("let builder = ", $builder, ".tls_ca_file(\"/etc/ssl/private-ca.pem\");")]
        /// # drop(builder);
        /// ```
        pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
            self.tls.ca = Some(path.into());
            self
        }

        /// Presents this client certificate for mutual TLS: `cert` a PEM file with the
        /// certificate (and its chain, if any), `key` the PEM file of its private key
        /// (PKCS#8, PKCS#1 or SEC1, not encrypted). [`build`](Self::build) reads both and
        /// refuses a file that holds no certificate or no key; the key's contents are never
        /// shown.
        #[doc = $when]
        ///
        /// ```
        #[doc = concat!("let builder = ", $builder, ".tls_client_cert(\"/etc/outbox/relay.crt\", \"/etc/outbox/relay.key\");")]
        /// # drop(builder);
        /// ```
        pub fn tls_client_cert(
            mut self,
            cert: impl Into<std::path::PathBuf>,
            key: impl Into<std::path::PathBuf>,
        ) -> Self {
            self.tls.client = Some((cert.into(), key.into()));
            self
        }
    };
}
pub(crate) use tls_methods;

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_SECRET_LINE: &str =
        "MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF";

    fn file(dir: &tempfile::TempDir, name: &str, contents: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn a_missing_or_wrong_file_names_its_option_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TlsFiles {
            ca: Some(dir.path().join("nope.pem")),
            client: None,
        };
        let err = missing.load().unwrap_err();
        assert_eq!(err.option, "tls_ca_file");
        assert!(err.reason.contains("nope.pem"), "{}", err.reason);

        let not_pem = file(&dir, "ca.txt", "hello");
        let err = TlsFiles {
            ca: Some(not_pem),
            client: None,
        }
        .load()
        .unwrap_err();
        assert!(err.reason.contains("no PEM certificate"), "{}", err.reason);

        // A key file given as the certificate: refused, naming it, and the key's contents are
        // not shown.
        let key = file(
            &dir,
            "client.key",
            &format!("-----BEGIN PRIVATE KEY-----\n{KEY_SECRET_LINE}\n-----END PRIVATE KEY-----\n"),
        );
        let err = TlsFiles {
            ca: None,
            client: Some((key.clone(), key.clone())),
        }
        .load()
        .unwrap_err();
        assert_eq!(err.option, "tls_client_cert");
        assert!(err.reason.contains("client.key"), "{}", err.reason);
        assert!(!err.reason.contains(KEY_SECRET_LINE), "{}", err.reason);
        assert!(!format!("{missing:?}").contains("BEGIN"));
    }
}
