//! Which broker `outbox relay` publishes to, and its publisher: `--broker` with a URL whose
//! scheme names the broker (`kafka://`, `nats://` or `tls://`, `amqp://` or `amqps://`), or
//! Kafka's `--brokers` / `KAFKA_BROKERS`.

use std::time::Duration;

use outbox::kafka::{KafkaPublisher, KafkaPublisherBuilder};
use outbox::nats::NatsPublisher;
use outbox::rabbitmq::RabbitMqPublisher;

use crate::{Fatal, RelayArgs, inputs};

/// The broker of `outbox relay`, with its address as the client takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Broker {
    /// Kafka's bootstrap servers, `host:port[,host:port…]`.
    Kafka(String),
    /// NATS servers, comma-separated `nats://` or `tls://` URLs.
    Nats(String),
    /// A RabbitMQ URI, `amqp://` or `amqps://`.
    RabbitMq(String),
}

impl Broker {
    /// The broker `args` name, or why they name none or two.
    pub(crate) fn of(args: &RelayArgs) -> Result<Broker, Fatal> {
        match (&args.broker, &args.brokers) {
            (Some(_), Some(_)) => Err(Fatal(
                "both --broker / OUTBOX_BROKER and --brokers / KAFKA_BROKERS are given: keep one"
                    .into(),
            )),
            (None, None) => Err(Fatal(
                "no broker: give --broker / OUTBOX_BROKER (kafka://host:9092, nats://host:4222 or amqp://user:password@host:5672/vhost), or Kafka's --brokers / KAFKA_BROKERS"
                    .into(),
            )),
            (None, Some(brokers)) if brokers.trim().is_empty() => Err(Fatal(
                "--brokers / KAFKA_BROKERS is empty: give the Kafka bootstrap servers, host:port[,host:port…]"
                    .into(),
            )),
            (None, Some(brokers)) => Ok(Broker::Kafka(brokers.trim().to_owned())),
            (Some(url), None) => Broker::parse(url.trim()),
        }
    }

    fn parse(url: &str) -> Result<Broker, Fatal> {
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let rest = url.split_once("://").map_or("", |(_, rest)| rest);
        let empty = scheme.is_some() && rest.trim_matches([',', '/', ' ']).is_empty();
        match scheme.as_deref() {
            _ if empty => Err(Fatal(format!(
                "--broker / OUTBOX_BROKER `{}` names no server",
                outbox::redact::url(url)
            ))),
            Some("kafka") => {
                // `kafka://a:9092,kafka://b:9092` or `kafka://a:9092,b:9092`.
                let hosts: Vec<&str> = url
                    .split(',')
                    .map(|h| {
                        h.trim()
                            .trim_start_matches("kafka://")
                            .trim_end_matches('/')
                    })
                    .filter(|h| !h.is_empty())
                    .collect();
                Ok(Broker::Kafka(hosts.join(",")))
            }
            Some("nats" | "tls") => Ok(Broker::Nats(url.to_owned())),
            Some("amqp" | "amqps") => Ok(Broker::RabbitMq(url.to_owned())),
            _ => Err(Fatal(format!(
                "--broker / OUTBOX_BROKER `{}`: the scheme names the broker: kafka://, nats:// (or tls://), amqp:// (or amqps://)",
                outbox::redact::url(url)
            ))),
        }
    }

    /// The flags the broker came from, and the TLS and login files given, for a message
    /// that tells what to check.
    pub(crate) fn flags(&self, args: &RelayArgs) -> String {
        if args.broker.is_none() {
            return "--brokers / KAFKA_BROKERS".to_owned();
        }
        let mut flags = vec!["--broker / OUTBOX_BROKER"];
        if args.broker_ca_file.is_some() {
            flags.push("--broker-ca-file");
        }
        if args.broker_cert_file.is_some() {
            flags.push("--broker-cert-file");
        }
        if args.nats_credentials_file.is_some() {
            flags.push("--nats-credentials-file");
        }
        flags.join(", ")
    }

    /// The broker for a log line: its kind and address, passwords redacted.
    pub(crate) fn describe(&self) -> String {
        match self {
            Broker::Kafka(brokers) => format!("kafka {brokers}"),
            Broker::Nats(servers) => format!("nats {}", outbox::redact::urls(servers)),
            Broker::RabbitMq(uri) => format!("rabbitmq {}", outbox::redact::urls(uri)),
        }
    }

    /// Refuses the flags of other brokers: they would be silently ignored.
    pub(crate) fn check_flags(&self, args: &RelayArgs) -> Result<(), Fatal> {
        if args.nats_credentials_file.is_some() && !matches!(self, Broker::Nats(_)) {
            return Err(Fatal(format!(
                "--nats-credentials-file / OUTBOX_NATS_CREDENTIALS_FILE is for NATS: it does not apply to {}",
                self.describe()
            )));
        }
        let tls_files = args.broker_ca_file.is_some() || args.broker_cert_file.is_some();
        if tls_files && matches!(self, Broker::Kafka(_)) {
            return Err(Fatal(
                "--broker-ca-file, --broker-cert-file and --broker-key-file are for NATS and RabbitMQ: give Kafka's TLS files as ssl.ca.location, ssl.certificate.location and ssl.key.location in --kafka-config-file"
                    .into(),
            ));
        }
        let kafka_only = !args.kafka_config.is_empty()
            || args.kafka_config_file.is_some()
            || std::env::var_os("OUTBOX_KAFKA_CONFIG").is_some();
        if kafka_only && !matches!(self, Broker::Kafka(_)) {
            return Err(Fatal(format!(
                "--kafka-config, --kafka-config-file and OUTBOX_KAFKA_CONFIG are librdkafka settings: they do not apply to {}",
                self.describe()
            )));
        }
        Ok(())
    }
}

/// The Kafka publisher of `outbox relay`, and a builder for the `/readyz` probe's own.
pub(crate) fn kafka(
    args: &RelayArgs,
    brokers: &str,
) -> Result<(KafkaPublisher, KafkaPublisherBuilder), Fatal> {
    let mut builder = KafkaPublisher::builder()
        .brokers(brokers.to_owned())
        .message_timeout(Duration::from_millis(args.message_timeout));
    if let Some(prefix) = &args.topic_prefix {
        builder = builder.topic_prefix(prefix.clone());
    }
    let env_config = std::env::var("OUTBOX_KAFKA_CONFIG").ok();
    for (key, value) in inputs::kafka_settings(
        args.kafka_config_file.as_deref(),
        env_config.as_deref(),
        &args.kafka_config,
    )? {
        builder = builder.set(key, value);
    }
    let publisher = builder.clone().build().map_err(|e| match e {
        // Only reachable through `--kafka-config bootstrap.servers=`: name the flags.
        outbox::kafka::KafkaConfigError::MissingBrokers => Fatal(
            "no Kafka brokers: --brokers / KAFKA_BROKERS is overridden by an empty --kafka-config bootstrap.servers"
                .into(),
        ),
        e => Fatal(format!(
            "{e} (check --kafka-config, OUTBOX_KAFKA_CONFIG and --kafka-config-file)"
        )),
    })?;
    Ok((publisher, builder))
}

/// The NATS JetStream publisher of `outbox relay`: `--message-timeout` bounds each publish
/// acknowledgement, `--topic-prefix` prefixes every subject.
pub(crate) async fn nats(args: &RelayArgs, servers: &str) -> Result<NatsPublisher, Fatal> {
    let mut builder = NatsPublisher::builder()
        .servers(servers)
        .ack_timeout(Duration::from_millis(args.message_timeout));
    if let Some(prefix) = &args.topic_prefix {
        builder = builder.subject_prefix(prefix.clone());
    }
    if let Some(ca) = &args.broker_ca_file {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&args.broker_cert_file, &args.broker_key_file) {
        builder = builder.tls_client_cert(cert, key);
    }
    if let Some(creds) = &args.nats_credentials_file {
        builder = builder.credentials_file(creds);
    }
    builder.build().await.map_err(|e| {
        let option = match &e {
            outbox::nats::NatsConfigError::InvalidOption { option, .. } => option.as_str(),
            _ => "servers",
        };
        Fatal(format!("{e} (check {})", flags_of(option)))
    })
}

/// The RabbitMQ publisher of `outbox relay`: `--message-timeout` bounds each publisher
/// confirm (and connecting), `--topic-prefix` prefixes every exchange.
pub(crate) fn rabbitmq(args: &RelayArgs, uri: &str) -> Result<RabbitMqPublisher, Fatal> {
    let mut builder = RabbitMqPublisher::builder()
        .uri(uri)
        .confirm_timeout(Duration::from_millis(args.message_timeout));
    if let Some(prefix) = &args.topic_prefix {
        builder = builder.exchange_prefix(prefix.clone());
    }
    if let Some(ca) = &args.broker_ca_file {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&args.broker_cert_file, &args.broker_key_file) {
        builder = builder.tls_client_cert(cert, key);
    }
    builder.build().map_err(|e| {
        let option = match &e {
            outbox::rabbitmq::RabbitMqConfigError::InvalidOption { option, .. } => option.as_str(),
            _ => "uri",
        };
        Fatal(format!("{e} (check {})", flags_of(option)))
    })
}

/// The flags that set a NATS or RabbitMQ builder's `option`.
fn flags_of(option: &str) -> &'static str {
    match option {
        "tls_ca_file" => "--broker-ca-file / OUTBOX_BROKER_CA_FILE",
        "tls_client_cert" => "--broker-cert-file and --broker-key-file",
        "credentials_file" => "--nats-credentials-file / OUTBOX_NATS_CREDENTIALS_FILE",
        "ack_timeout" | "confirm_timeout" => "--message-timeout",
        _ => "--broker / OUTBOX_BROKER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> Result<Broker, String> {
        Broker::parse(url).map_err(|Fatal(e)| e)
    }

    #[test]
    fn the_scheme_names_the_broker() {
        assert_eq!(
            parsed("kafka://k1:9092,kafka://k2:9092").unwrap(),
            Broker::Kafka("k1:9092,k2:9092".into())
        );
        assert_eq!(
            parsed("kafka://k1:9092,k2:9092/").unwrap(),
            Broker::Kafka("k1:9092,k2:9092".into())
        );
        assert_eq!(
            parsed("nats://n:4222").unwrap(),
            Broker::Nats("nats://n:4222".into())
        );
        assert_eq!(
            parsed("amqps://u:p@r:5671/%2f").unwrap(),
            Broker::RabbitMq("amqps://u:p@r:5671/%2f".into())
        );
        let e = parsed("redis://u:hunter2@r:6379").unwrap_err();
        assert!(
            e.contains("the scheme names the broker") && !e.contains("hunter2"),
            "{e}"
        );
        let e = parsed("n:4222").unwrap_err();
        assert!(e.contains("the scheme names the broker"), "{e}");
        let e = parsed("nats://").unwrap_err();
        assert!(e.contains("names no server"), "{e}");
    }
}
