//! Opening a connection, bounded in time, with errors that never show the URI's password.

use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::runtime::default_runtime;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Channel, Connection, ConnectionProperties};

use crate::broker_tls::TlsPem;
use crate::redact;

/// The least time between two connection attempts: a broker that is down is not asked more
/// often than this, however many publishes or receives want it.
pub(crate) const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// Connects to `uri` within `timeout`, naming the connection `name` (shown in the management
/// UI), with the TLS files' CA and client certificate for an `amqps://` URI. The error names
/// the URI without its password.
pub(crate) async fn connect(
    uri: &str,
    tls: &TlsPem,
    name: &str,
    timeout: Duration,
) -> Result<Connection, String> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let config = OwnedTLSConfig {
        cert_chain: tls.ca.clone(),
        identity: tls.client.as_ref().map(|(pem, key)| OwnedIdentity::PKCS8 {
            pem: pem.clone(),
            key: key.clone(),
        }),
    };
    let connecting = async {
        Connection::connect_with_config(uri, properties, config, default_runtime()?).await
    };
    match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(format!(
            "cannot connect to RabbitMQ at {}: {e}",
            redact::url(uri)
        )),
        Err(_) => Err(format!(
            "cannot connect to RabbitMQ at {} within {timeout:?}",
            redact::url(uri)
        )),
    }
}

/// A new channel on `connection` in publisher-confirm mode.
pub(crate) async fn confirm_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}
