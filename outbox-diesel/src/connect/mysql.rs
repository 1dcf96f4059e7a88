//! [`mysql`]: an `AsyncMysqlConnection` from a URL, with TLS as MySQL's `ssl-mode` asks.

use diesel_async::AsyncMysqlConnection;

use super::ConnectError;

/// MySQL's `--ssl-mode`, in increasing strength.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SslMode {
    Disabled,
    Preferred,
    Required,
    VerifyCa,
    VerifyIdentity,
}

/// A MySQL URL split into what mysql_async reads and the TLS settings (a build without TLS
/// reads the mode only, to refuse what it cannot do).
#[derive(Debug)]
#[cfg_attr(not(feature = "mysql_tls"), allow(dead_code))]
struct MysqlUrl {
    url: String,
    server: String,
    mode: SslMode,
    ca: Option<std::path::PathBuf>,
    /// The client certificate (chain) and its key, PEM files.
    identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl MysqlUrl {
    fn parse(url: &str) -> Result<MysqlUrl, ConnectError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut mode = None;
        let mut ca = None;
        let (mut cert, mut key) = (None, None);
        let path = |v: &str| std::path::PathBuf::from(super::url::decode(v).into_owned());
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "ssl-mode" | "ssl_mode" => {
                    mode = Some(match v.to_ascii_uppercase().as_str() {
                        "DISABLED" => SslMode::Disabled,
                        "PREFERRED" => SslMode::Preferred,
                        "REQUIRED" => SslMode::Required,
                        "VERIFY_CA" => SslMode::VerifyCa,
                        "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
                        other => {
                            return Err(ConnectError::Url(format!(
                                "invalid ssl-mode \"{other}\": expected DISABLED, PREFERRED, \
                                 REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                            )));
                        }
                    })
                }
                "ssl-ca" | "ssl_ca" => ca = Some(path(v)),
                "ssl-cert" | "ssl_cert" => cert = Some(path(v)),
                "ssl-key" | "ssl_key" => key = Some(path(v)),
                _ => kept.push(pair),
            }
        }
        // A CA without a mode asks for the server to be checked.
        let mode = mode.unwrap_or(if ca.is_some() {
            SslMode::VerifyIdentity
        } else {
            SslMode::Disabled
        });
        if mode == SslMode::VerifyCa {
            // mysql_async 0.36 skips the name check by matching rustls's error text, which
            // rustls 0.23.48 no longer words that way: its VERIFY_CA checks the name too, and
            // would refuse what MySQL's VERIFY_CA accepts. Say so rather than differ.
            return Err(ConnectError::Url(
                "ssl-mode=VERIFY_CA is not supported (the driver checks the host name as well): \
                 use VERIFY_IDENTITY with ssl-ca=<PEM file>, or REQUIRED"
                    .to_owned(),
            ));
        }
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConnectError::Url(
                    "ssl-cert is given without ssl-key (the client certificate's key)".to_owned(),
                ));
            }
            (None, Some(_)) => {
                return Err(ConnectError::Url(
                    "ssl-key is given without ssl-cert (the client certificate)".to_owned(),
                ));
            }
        };
        if identity.is_some() && mode == SslMode::Disabled {
            return Err(ConnectError::Url(
                "ssl-cert and ssl-key need TLS, which ssl-mode=DISABLED turns off".to_owned(),
            ));
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(MysqlUrl {
            server: super::url::server_of(base, 3306),
            url,
            mode,
            ca,
            identity,
        })
    }
}

/// Opens an [`AsyncMysqlConnection`] to `url` (`mysql://…`), honouring MySQL's `ssl-mode`
/// (`DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_IDENTITY`; `VERIFY_CA` is refused, as the
/// driver cannot leave out the host name check) and `ssl-ca` (a PEM file of trusted roots;
/// without it `VERIFY_IDENTITY` trusts the Mozilla roots). `REQUIRED` and `PREFERRED` encrypt
/// without verifying; `PREFERRED` falls back to plain when the server has no TLS. Without
/// `ssl-mode` the session is plain, as diesel-async's own `establish`, unless `ssl-ca` is
/// given (then `VERIFY_IDENTITY`). `ssl-cert` and `ssl-key` (PEM files, given together) are a
/// client certificate and its RSA key (PKCS#1 or PKCS#8), for a user created `REQUIRE X509`.
/// Errors are one line naming the server, never the password.
pub async fn mysql(url: &str) -> Result<AsyncMysqlConnection, ConnectError> {
    let url = MysqlUrl::parse(url)?;
    open(&url).await
}

#[cfg(feature = "mysql_tls")]
async fn open(url: &MysqlUrl) -> Result<AsyncMysqlConnection, ConnectError> {
    use mysql_async::{Opts, OptsBuilder, SslOpts};

    let opts = Opts::from_url(&url.url).map_err(|e| ConnectError::Url(e.to_string()))?;
    // As diesel-async's `establish`: its own statement cache, and found rows counted.
    let builder = OptsBuilder::from_opts(opts)
        .stmt_cache_size(0)
        .client_found_rows(true);
    let ssl = match url.mode {
        SslMode::Disabled => None,
        SslMode::Preferred | SslMode::Required => Some(
            SslOpts::default()
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
        ),
        SslMode::VerifyCa | SslMode::VerifyIdentity => Some(
            SslOpts::default()
                .with_disable_built_in_roots(url.ca.is_some())
                .with_root_certs(url.ca.iter().map(|p| p.clone().into()).collect()),
        ),
    };
    let ssl = match (ssl, &url.identity) {
        (Some(ssl), Some((cert, key))) => Some(ssl.with_client_identity(Some(
            mysql_async::ClientIdentity::new(cert.clone().into(), rsa_key(key)?.into()),
        ))),
        (ssl, _) => ssl,
    };
    let conn = match mysql_async::Conn::new(builder.clone().ssl_opts(ssl)).await {
        // PREFERRED: plain when the server offers no TLS.
        Err(mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer))
            if url.mode == SslMode::Preferred =>
        {
            mysql_async::Conn::new(builder.ssl_opts(None)).await
        }
        other => other,
    }
    .map_err(|e| connect_error(url, &e))?;
    AsyncMysqlConnection::try_from(conn)
        .await
        .map_err(|e| connect_error(url, &e))
}

/// The client key at `path` as the PKCS#1 DER the driver reads (its rustls support takes an
/// RSA key in that form only): from a PEM file holding a PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8
/// (`PRIVATE KEY`) RSA key. Any other key is refused naming the file.
#[cfg(feature = "mysql_tls")]
fn rsa_key(path: &std::path::Path) -> Result<Vec<u8>, ConnectError> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;

    let refuse = |reason: String| ConnectError::File {
        param: "ssl-key",
        path: path.to_owned(),
        reason,
    };
    match PrivateKeyDer::from_pem_file(path).map_err(|e| refuse(e.to_string()))? {
        PrivateKeyDer::Pkcs1(key) => Ok(key.secret_pkcs1_der().to_vec()),
        PrivateKeyDer::Pkcs8(key) => pkcs1_of_pkcs8(key.secret_pkcs8_der()).ok_or_else(|| {
            refuse("not an RSA key (the MySQL driver takes RSA client keys only)".to_owned())
        }),
        _ => Err(refuse(
            "not an RSA key (the MySQL driver takes RSA client keys only)".to_owned(),
        )),
    }
}

/// The PKCS#1 `RSAPrivateKey` inside a PKCS#8 `PrivateKeyInfo` (RFC 5208: a SEQUENCE of the
/// version, the algorithm and the key as an OCTET STRING), if its algorithm is
/// `rsaEncryption`.
#[cfg(any(feature = "mysql_tls", test))]
fn pkcs1_of_pkcs8(der: &[u8]) -> Option<Vec<u8>> {
    /// One DER element: its tag, its contents and what follows it.
    fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    /// The OID 1.2.840.113549.1.1.1, `rsaEncryption`, encoded.
    const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    let (0x30, info, _) = element(der)? else {
        return None;
    };
    let (0x02, _version, rest) = element(info)? else {
        return None;
    };
    let (0x30, algorithm, rest) = element(rest)? else {
        return None;
    };
    let (0x06, oid, _) = element(algorithm)? else {
        return None;
    };
    let (0x04, key, _) = element(rest)? else {
        return None;
    };
    (oid == RSA_ENCRYPTION).then(|| key.to_vec())
}

#[cfg(feature = "mysql_tls")]
fn connect_error(url: &MysqlUrl, e: &(dyn std::error::Error + 'static)) -> ConnectError {
    let host = url
        .server
        .rsplit_once(':')
        .map_or(url.server.as_str(), |(h, _)| h);
    if let Some(tls) = super::tls_cause(e) {
        return ConnectError::Tls {
            server: url.server.clone(),
            reason: super::describe(tls, host, "ssl-ca"),
        };
    }
    ConnectError::Connect {
        server: url.server.clone(),
        reason: e.to_string().lines().next().unwrap_or_default().to_owned(),
    }
}

/// Without rustls: plain sessions only.
#[cfg(not(feature = "mysql_tls"))]
async fn open(url: &MysqlUrl) -> Result<AsyncMysqlConnection, ConnectError> {
    use diesel_async::AsyncConnection;

    if url.mode >= SslMode::Required || url.identity.is_some() {
        return Err(ConnectError::Url(
            "this ssl-mode (or ssl-cert) needs TLS, and this build has none (outbox-diesel's \
             feature `mysql_tls`)"
                .to_owned(),
        ));
    }
    AsyncMysqlConnection::establish(&url.url)
        .await
        .map_err(|e| ConnectError::Connect {
            server: url.server.clone(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_needs_its_key_and_tls() {
        let u =
            MysqlUrl::parse("mysql://db/app?ssl-mode=REQUIRED&ssl-cert=%2Fc.pem&ssl-key=%2Fk.pem")
                .unwrap();
        assert_eq!(u.url, "mysql://db/app");
        assert_eq!(
            u.identity,
            Some(("/c.pem".into(), "/k.pem".into())),
            "both files, decoded"
        );
        for (url, said) in [
            (
                "mysql://db/app?ssl-mode=REQUIRED&ssl-cert=/c.pem",
                "ssl-cert is given without ssl-key",
            ),
            (
                "mysql://db/app?ssl-mode=REQUIRED&ssl-key=/k.pem",
                "ssl-key is given without ssl-cert",
            ),
            (
                "mysql://db/app?ssl-cert=/c.pem&ssl-key=/k.pem",
                "ssl-mode=DISABLED",
            ),
        ] {
            let e = MysqlUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(said), "{url}: {e}");
        }
    }

    #[test]
    fn the_rsa_key_inside_pkcs8_is_found_and_others_are_not() {
        // A PKCS#8 wrapping of a (short, made-up) RSAPrivateKey, and the same with the
        // id-ecPublicKey OID in its place.
        let inner = [0x30, 0x03, 0x02, 0x01, 0x00];
        let rsa_alg = [
            0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05,
            0x00,
        ];
        let wrap = |alg: &[u8]| {
            let mut body = vec![0x02, 0x01, 0x00];
            body.extend_from_slice(alg);
            body.push(0x04);
            body.push(inner.len() as u8);
            body.extend_from_slice(&inner);
            let mut der = vec![0x30, body.len() as u8];
            der.extend(body);
            der
        };
        assert_eq!(pkcs1_of_pkcs8(&wrap(&rsa_alg)), Some(inner.to_vec()));
        let ec_alg = [
            0x30, 0x09, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
        ];
        assert_eq!(pkcs1_of_pkcs8(&wrap(&ec_alg)), None);
        let whole = wrap(&rsa_alg);
        for cut in 0..whole.len() {
            assert_eq!(pkcs1_of_pkcs8(&whole[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn ssl_parameters_are_taken_out() {
        let u = MysqlUrl::parse(
            "mysql://root:pw@db:3307/app?ssl-mode=verify_identity&ssl-ca=%2Fca.pem&prefer_socket=false",
        )
        .unwrap();
        assert_eq!(u.url, "mysql://root:pw@db:3307/app?prefer_socket=false");
        assert_eq!(u.server, "db:3307");
        assert_eq!(u.mode, SslMode::VerifyIdentity);
        assert_eq!(u.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        let u = MysqlUrl::parse("mysql://root@127.0.0.1/app").unwrap();
        assert_eq!(
            (u.mode, u.server.as_str()),
            (SslMode::Disabled, "127.0.0.1:3306")
        );
        assert!(MysqlUrl::parse("mysql://h/app?ssl-mode=VERIFY_CA&ssl-ca=/ca.pem").is_err());
        assert!(MysqlUrl::parse("mysql://h/app?ssl-mode=STRICT").is_err());
    }
}
