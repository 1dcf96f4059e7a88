//! tokio-postgres's TLS connector over rustls (the `ring` provider), verifying the server as
//! libpq's `sslmode` says: not at all (`prefer`, `require`), its chain (`verify-ca`), or its
//! chain and name (`verify-full`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use super::ConnectError;
use super::pg_url::{PgUrl, Roots, SslMode};

/// The rustls client configuration `url` asks for.
pub(crate) fn client_config(url: &PgUrl) -> Result<Arc<ClientConfig>, ConnectError> {
    // rustls deprecates its `ring` provider for lacking post-quantum key exchange; it is kept
    // because the alternative, aws-lc-rs, needs cmake and minutes of C build on every fresh
    // checkout. The classical key exchanges it offers (X25519, P-256, P-384) are what
    // PostgreSQL servers negotiate.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::Url(format!("TLS setup: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = if url.mode >= SslMode::VerifyCa {
        let roots = Arc::new(roots(&url.roots)?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| ConnectError::Url(format!("TLS setup: {e}")))?;
        if url.mode == SslMode::VerifyFull {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        }
    } else {
        Arc::new(Unverified(provider.signature_verification_algorithms))
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &url.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error("sslcert", cert, e))?;
            if chain.is_empty() {
                return Err(file_error("sslcert", cert, "no certificate in it"));
            }
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("sslkey", key, e))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| file_error("sslkey", key, e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn file_error(
    param: &'static str,
    path: &std::path::Path,
    e: impl std::fmt::Display,
) -> ConnectError {
    ConnectError::File {
        param,
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

fn roots(roots: &Roots) -> Result<RootCertStore, ConnectError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| file_error("sslrootcert", path, e))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(file_error(
                    "sslrootcert",
                    path,
                    "no usable certificate in it",
                ));
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(ConnectError::Url(
                    "sslrootcert=system: the platform has no trusted root certificates".to_owned(),
                ));
            }
        }
        Roots::None => {}
    }
    Ok(store)
}

/// `prefer` and `require`: encryption without verification, as libpq. The handshake's
/// signatures are still checked, so the session is with the holder of the certificate's key.
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked. webpki checks
/// the chain before the name, so a name mismatch means the chain passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// tokio-postgres's `MakeTlsConnect` over a rustls configuration.
#[derive(Clone)]
pub(crate) struct MakeRustls(pub Arc<ClientConfig>);

impl MakeTlsConnect<tokio_postgres::Socket> for MakeRustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, Self::Error> {
        Ok(RustlsConnect {
            config: self.0.clone(),
            name: ServerName::try_from(host.to_owned())?,
        })
    }
}

/// One handshake, with the host's name.
pub(crate) struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl TlsConnect<tokio_postgres::Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream>> + Send>>;

    fn connect(self, stream: tokio_postgres::Socket) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            let tls = connector.connect(self.name, stream).await?;
            Ok(RustlsStream(Box::new(tls)))
        })
    }
}

/// The encrypted stream tokio-postgres runs on.
pub(crate) struct RustlsStream(Box<tokio_rustls::client::TlsStream<tokio_postgres::Socket>>);

impl tokio_postgres::tls::TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
