//! libpq's TLS parameters, read from a PostgreSQL URL and taken out of it (tokio-postgres
//! refuses the ones it does not know).

use std::path::PathBuf;

use super::ConnectError;
use super::url::{decode, server_of};

/// libpq's `sslmode`, in increasing strength.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where the trusted roots come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Roots {
    /// None given and no default file: nothing can be verified.
    None,
    /// A PEM file.
    File(PathBuf),
    /// The platform's trusted roots.
    System,
}

/// A PostgreSQL URL split into what tokio-postgres reads and the TLS settings (a build
/// without TLS reads the mode only, to refuse what it cannot do).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) struct PgUrl {
    /// The URL without the TLS parameters.
    pub url: String,
    /// `host:port` as messages name it (no user, no password).
    pub server: String,
    pub mode: SslMode,
    pub roots: Roots,
    /// `(sslcert, sslkey)`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The parameters taken out of the URL.
const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// libpq's environment variables for the TLS parameters, read where the URL does not give the
/// parameter.
const TLS_ENV: [(&str, &str); 4] = [
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
];

impl PgUrl {
    /// Reads `url` as libpq would in this process: `home` is where its default files
    /// (`.postgresql/…`) are looked for, and the TLS parameters the URL does not give come
    /// from `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`.
    pub fn from_env(url: &str) -> Result<PgUrl, ConnectError> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        Self::parse_with(url, home, &|name| std::env::var(name).ok())
    }

    /// Reads `url`; `home` is where libpq's default files (`.postgresql/…`) are looked for.
    #[cfg(test)]
    pub fn parse(url: &str, home: Option<PathBuf>) -> Result<PgUrl, ConnectError> {
        Self::parse_with(url, home, &|_| None)
    }

    /// Reads `url`; `home` is where libpq's default files are looked for, `env` gives the
    /// environment's value of a variable.
    fn parse_with(
        url: &str,
        home: Option<PathBuf>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PgUrl, ConnectError> {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let mut kept = Vec::new();
        let mut mode = None;
        let mut rootcert = None;
        let mut cert = None;
        let mut key = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = decode(k);
            if !TLS_PARAMS.contains(&k.as_ref()) {
                kept.push(pair);
                continue;
            }
            let v = decode(v).into_owned();
            match k.as_ref() {
                "sslmode" => mode = Some(parse_mode(&v)?),
                "sslrootcert" => rootcert = Some(v),
                "sslcert" => cert = Some(PathBuf::from(v)),
                _ => key = Some(PathBuf::from(v)),
            }
        }
        for (param, var) in TLS_ENV {
            let Some(v) = env(var).filter(|v| !v.is_empty()) else {
                continue;
            };
            match param {
                "sslmode" if mode.is_none() => {
                    mode = Some(parse_mode(&v).map_err(|e| match e {
                        ConnectError::Url(msg) => ConnectError::Url(format!("{var}: {msg}")),
                        other => other,
                    })?)
                }
                "sslrootcert" if rootcert.is_none() => rootcert = Some(v),
                "sslcert" if cert.is_none() => cert = Some(PathBuf::from(v)),
                "sslkey" if key.is_none() => key = Some(PathBuf::from(v)),
                _ => {}
            }
        }
        let dot_pg = home.map(|h| h.join(".postgresql"));
        let default_file = |name: &str| {
            dot_pg
                .as_ref()
                .map(|d| d.join(name))
                .filter(|p| p.is_file())
        };
        let roots = match rootcert.as_deref() {
            Some("system") => Roots::System,
            Some(file) => Roots::File(PathBuf::from(file)),
            None => default_file("root.crt").map_or(Roots::None, Roots::File),
        };
        let mode = match (mode, &roots) {
            // libpq: `sslrootcert=system` makes the default mode `verify-full`, and refuses a
            // weaker one given explicitly.
            (None, Roots::System) => SslMode::VerifyFull,
            (Some(m), Roots::System) if m < SslMode::VerifyFull => {
                return Err(ConnectError::Url(format!(
                    "weak sslmode \"{}\" may not be used with sslrootcert=system (use \"verify-full\")",
                    mode_name(m)
                )));
            }
            // libpq: with a root certificate, `require` verifies the chain as `verify-ca`.
            (Some(SslMode::Require), Roots::File(_)) => SslMode::VerifyCa,
            (m, _) => m.unwrap_or(SslMode::Prefer),
        };
        if mode >= SslMode::VerifyCa && roots == Roots::None {
            return Err(ConnectError::Url(format!(
                "sslmode={} verifies the server's certificate and needs the trusted roots: give \
                 sslrootcert=<PEM file> (or sslrootcert=system for the platform's)",
                mode_name(mode)
            )));
        }
        let client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConnectError::Url(
                    "sslcert and sslkey go together: give both".to_owned(),
                ));
            }
            (None, None) => default_file("postgresql.crt").zip(default_file("postgresql.key")),
        };
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(PgUrl {
            server: server_of(base, 5432),
            url,
            mode,
            roots,
            client_cert,
        })
    }
}

fn parse_mode(v: &str) -> Result<SslMode, ConnectError> {
    Ok(match v {
        "disable" => SslMode::Disable,
        "allow" => SslMode::Allow,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(ConnectError::Url(format!(
                "invalid sslmode \"{other}\": expected disable, allow, prefer, require, verify-ca \
                 or verify-full"
            )));
        }
    })
}

/// The mode as the URL writes it.
pub(crate) fn mode_name(m: SslMode) -> &'static str {
    match m {
        SslMode::Disable => "disable",
        SslMode::Allow => "allow",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> PgUrl {
        PgUrl::parse(url, None).expect("parses")
    }

    #[test]
    fn the_environment_gives_what_the_url_does_not() {
        let env = |name: &str| match name {
            "PGSSLMODE" => Some("verify-full".to_owned()),
            "PGSSLROOTCERT" => Some("/env/ca.pem".to_owned()),
            "PGSSLCERT" => Some("/env/c.crt".to_owned()),
            "PGSSLKEY" => Some("/env/c.key".to_owned()),
            _ => None,
        };
        let u = PgUrl::parse_with("postgres://db/app", None, &env).unwrap();
        assert_eq!(u.mode, SslMode::VerifyFull);
        assert_eq!(u.roots, Roots::File("/env/ca.pem".into()));
        assert_eq!(
            u.client_cert,
            Some(("/env/c.crt".into(), "/env/c.key".into()))
        );
        // The URL's own parameters win.
        let u = PgUrl::parse_with(
            "postgres://db/app?sslmode=require&sslrootcert=%2Furl%2Fca.pem",
            None,
            &env,
        )
        .unwrap();
        assert_eq!(
            (u.mode, u.roots),
            (SslMode::VerifyCa, Roots::File("/url/ca.pem".into()))
        );
        let bad = |name: &str| (name == "PGSSLMODE").then(|| "strict".to_owned());
        let e = PgUrl::parse_with("postgres://db/app", None, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("PGSSLMODE") && e.contains("strict"), "{e}");
    }

    #[test]
    fn tls_parameters_are_taken_out_and_the_rest_kept() {
        let u = parse(
            "postgres://u:secret@db.example:6432/app?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5",
        );
        assert_eq!(
            u.url,
            "postgres://u:secret@db.example:6432/app?application_name=x&connect_timeout=5"
        );
        assert_eq!(u.server, "db.example:6432");
        assert_eq!(u.mode, SslMode::VerifyFull);
        assert_eq!(u.roots, Roots::File(PathBuf::from("/etc/ca.pem")));
        assert_eq!(
            parse("postgres://h/db?sslmode=disable").url,
            "postgres://h/db"
        );
    }

    #[test]
    fn modes_follow_libpq() {
        assert_eq!(parse("postgres://h/db").mode, SslMode::Prefer);
        assert_eq!(parse("postgres://h/db").server, "h:5432");
        assert_eq!(
            parse("postgres://h/db?sslmode=require&sslrootcert=/ca.pem").mode,
            SslMode::VerifyCa
        );
        assert_eq!(
            parse("postgres://h/db?sslrootcert=system").mode,
            SslMode::VerifyFull
        );
        for bad in [
            "postgres://h/db?sslmode=verify-full",
            "postgres://h/db?sslmode=require&sslrootcert=system",
            "postgres://h/db?sslmode=strict",
            "postgres://h/db?sslcert=/c.pem",
        ] {
            assert!(
                matches!(PgUrl::parse(bad, None), Err(ConnectError::Url(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_server_never_carries_the_password() {
        let u = parse("postgresql://user:p%40ss@[::1]:5433,other/db?sslmode=require");
        assert_eq!(u.server, "[::1]:5433,other:5432");
        assert!(!u.server.contains("p@ss"));
    }
}
