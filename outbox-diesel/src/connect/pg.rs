//! [`postgres`]: an `AsyncPgConnection` from a URL, with TLS as libpq's parameters ask.

use diesel_async::AsyncPgConnection;

use super::ConnectError;
use super::pg_url::{PgUrl, SslMode};

/// Opens an [`AsyncPgConnection`] to `url` (`postgres://…`), honouring libpq's `sslmode`,
/// `sslrootcert`, `sslcert` and `sslkey` (see the [module docs](super)).
///
/// A failure is one line naming the server and what failed, never the password:
/// `cannot connect to 127.0.0.1:5544: TLS: certificate not valid for name "127.0.0.1"`.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), outbox_diesel::connect::ConnectError> {
/// let conn = outbox_diesel::connect::postgres(
///     "postgres://relay@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem",
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub async fn postgres(url: &str) -> Result<AsyncPgConnection, ConnectError> {
    let url = PgUrl::from_env(url)?;
    open(&url, false).await
}

/// [`postgres`] for a connection through a pooler in transaction mode (PgBouncer's
/// `pool_mode = transaction`): diesel-async's connection set-up (`SET TIME ZONE`, `SET
/// CLIENT_ENCODING`, run as prepared statements) runs inside a transaction, so that each
/// statement is prepared and run on one server connection and nothing prepared is left on
/// one. The relay's stores open their connections with it when told they are behind such a
/// pooler; a connection factory given to them can too.
///
/// ```no_run
/// # async fn run() -> Result<(), outbox_diesel::connect::ConnectError> {
/// let conn =
///     outbox_diesel::connect::postgres_pooled("postgres://relay@pgbouncer.internal:6432/app")
///         .await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "relay")]
pub async fn postgres_pooled(url: &str) -> Result<AsyncPgConnection, ConnectError> {
    let url = PgUrl::from_env(url)?;
    open(&url, true).await
}

/// The connection from a connected client: diesel-async's set-up, in a transaction when
/// `pooled` (see [`postgres_pooled`]); then the connection is driven by a task of its own,
/// which ends when the connection is dropped.
#[cfg(any(feature = "tls", feature = "relay"))]
async fn finish<S>(
    url: &PgUrl,
    client: tokio_postgres::Client,
    conn: tokio_postgres::Connection<tokio_postgres::Socket, S>,
    pooled: bool,
) -> Result<AsyncPgConnection, ConnectError>
where
    S: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
{
    if !pooled {
        return AsyncPgConnection::try_from_client_and_connection(client, conn)
            .await
            .map_err(|e| connect_error(url, &e));
    }
    use diesel_async::SimpleAsyncConnection;
    tokio::spawn(async move {
        // Its error reaches the client's next call, which fails with it.
        let _ = conn.await;
    });
    client
        .batch_execute("BEGIN")
        .await
        .map_err(|e| connect_error(url, &e))?;
    let mut conn = AsyncPgConnection::try_from(client)
        .await
        .map_err(|e| connect_error(url, &e))?;
    conn.batch_execute("COMMIT")
        .await
        .map_err(|e| connect_error(url, &e))?;
    Ok(conn)
}

#[cfg(feature = "tls")]
async fn open(url: &PgUrl, pooled: bool) -> Result<AsyncPgConnection, ConnectError> {
    use super::tls::{MakeRustls, client_config};
    use tokio_postgres::config::SslMode as Mode;

    let config: tokio_postgres::Config = url
        .url
        .parse()
        .map_err(|e: tokio_postgres::Error| ConnectError::Url(e.to_string()))?;
    let plain = |mut config: tokio_postgres::Config| async move {
        config.ssl_mode(Mode::Disable);
        let (client, conn) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| connect_error(url, &e))?;
        finish(url, client, conn, pooled).await
    };
    let tls = |mut config: tokio_postgres::Config, mode: Mode| async move {
        config.ssl_mode(mode);
        let (client, conn) = config
            .connect(MakeRustls(client_config(url)?))
            .await
            .map_err(|e| connect_error(url, &e))?;
        finish(url, client, conn, pooled).await
    };
    match url.mode {
        SslMode::Disable => plain(config).await,
        // libpq: plain first, TLS when the server refuses the plain session.
        SslMode::Allow => match plain(config.clone()).await {
            Ok(conn) => Ok(conn),
            Err(ConnectError::Connect { .. }) => tls(config, Mode::Require).await,
            Err(e) => Err(e),
        },
        SslMode::Prefer => tls(config, Mode::Prefer).await,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tls(config, Mode::Require).await
        }
    }
}

/// Without rustls: plain sessions only.
#[cfg(not(feature = "tls"))]
async fn open(url: &PgUrl, pooled: bool) -> Result<AsyncPgConnection, ConnectError> {
    use diesel_async::AsyncConnection;

    if url.mode >= SslMode::Require {
        return Err(ConnectError::Url(format!(
            "sslmode={} needs TLS, and this build has none (outbox-diesel's feature `tls`)",
            super::pg_url::mode_name(url.mode)
        )));
    }
    #[cfg(feature = "relay")]
    if pooled {
        let mut config: tokio_postgres::Config = url
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| ConnectError::Url(e.to_string()))?;
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        let (client, conn) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| connect_error(url, &e))?;
        return finish(url, client, conn, true).await;
    }
    #[cfg(not(feature = "relay"))]
    let _ = pooled;
    AsyncPgConnection::establish(&url.url)
        .await
        .map_err(|e| ConnectError::Connect {
            server: url.server.clone(),
            reason: e.to_string(),
        })
}

/// A driver error as a [`ConnectError`]: a failed TLS handshake by its rustls cause, a
/// server's refusal by its message (one line: no DETAIL or HINT), anything else in the
/// driver's words with their causes.
#[cfg(any(feature = "tls", feature = "relay"))]
fn connect_error(url: &PgUrl, e: &(dyn std::error::Error + 'static)) -> ConnectError {
    let mut words: Vec<String> = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cause {
        #[cfg(feature = "tls")]
        if let Some(tls) = super::tls_cause(err) {
            let host = url
                .server
                .rsplit_once(':')
                .map_or(url.server.as_str(), |(h, _)| h);
            return ConnectError::Tls {
                server: url.server.clone(),
                reason: super::describe(tls, host, "sslrootcert"),
            };
        }
        if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
            words.push(format!("{}: {}", db.severity(), db.message()));
            break;
        }
        let said = err.to_string();
        let said = said.lines().next().unwrap_or_default();
        // tokio-postgres's "db error" only announces the server's message that follows.
        if said != "db error" && !words.iter().any(|w| w.contains(said)) {
            words.push(said.to_owned());
        }
        cause = err.source();
    }
    ConnectError::Connect {
        server: url.server.clone(),
        reason: words.join(": "),
    }
}
