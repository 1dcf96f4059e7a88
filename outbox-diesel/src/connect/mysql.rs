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
}

impl MysqlUrl {
    fn parse(url: &str) -> Result<MysqlUrl, ConnectError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut mode = None;
        let mut ca = None;
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
                "ssl-ca" | "ssl_ca" => {
                    ca = Some(std::path::PathBuf::from(super::url::decode(v).into_owned()))
                }
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
        })
    }
}

/// Opens an [`AsyncMysqlConnection`] to `url` (`mysql://…`), honouring MySQL's `ssl-mode`
/// (`DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_IDENTITY`; `VERIFY_CA` is refused, as the
/// driver cannot leave out the host name check) and `ssl-ca` (a PEM file of trusted roots;
/// without it `VERIFY_IDENTITY` trusts the Mozilla roots). `REQUIRED` and `PREFERRED` encrypt
/// without verifying; `PREFERRED` falls back to plain when the server has no TLS. Without
/// `ssl-mode` the session is plain, as diesel-async's own `establish`, unless `ssl-ca` is
/// given (then `VERIFY_IDENTITY`). Errors are one line naming the server, never the password.
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

    if url.mode >= SslMode::Required {
        return Err(ConnectError::Url(
            "this ssl-mode needs TLS, and this build has none (outbox-diesel's feature `mysql_tls`)"
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
