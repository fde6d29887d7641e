//! TLS for the AMQP listener (contract §10): the server's rustls config read from its
//! certificate and key files, and the acceptor that SIGHUP reloads.
//!
//! TLS 1.2 and 1.3 on rustls' aws-lc-rs provider; no OpenSSL. The certificate file is a PEM
//! chain, the server's own certificate first; the key file holds one PEM private key,
//! PKCS#8, PKCS#1 or SEC1. With a client CA (`--tls-client-ca`) every client must show a
//! certificate that CA signed, as RabbitMQ's `verify_peer` with `fail_if_no_peer_cert`.
//!
//! A reload builds a whole new config first and swaps it in only if that worked: a
//! connection takes the config current when it is accepted and keeps it, so a reload
//! never touches a connection already open, and a bad file on reload leaves the old
//! certificate serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::aws_lc_rs;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The files a TLS listener is configured from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The certificate chain (PEM), the server's certificate first.
    pub cert: PathBuf,
    /// The certificate's private key (PEM).
    pub key: PathBuf,
    /// Where given, clients must show a certificate this CA (PEM) signed.
    pub client_ca: Option<PathBuf>,
}

/// The TLS side of a listener: the config new connections are accepted with.
pub struct Tls {
    files: TlsFiles,
    current: RwLock<TlsAcceptor>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads `files` into a config: an error names the file and what is wrong with it.
    pub fn new(files: TlsFiles) -> Result<Tls, String> {
        let config = server_config(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(TlsAcceptor::from(config)),
        })
    }

    /// The acceptor for a connection accepted now.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current.read().expect("never poisoned").clone()
    }

    /// Reads the files again and serves new connections with what they hold now; on an
    /// error the config in use stays.
    pub fn reload(&self) -> Result<(), String> {
        let config = server_config(&self.files)?;
        *self.current.write().expect("never poisoned") = TlsAcceptor::from(config);
        Ok(())
    }

    /// Whether clients must show a certificate (and may log in with EXTERNAL).
    pub fn verifies_clients(&self) -> bool {
        self.files.client_ca.is_some()
    }
}

/// The server config `files` describe.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let certs = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: no PEM private key read: {e}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        let why = match e {
            rustls::Error::InconsistentKeys(_) => {
                "the private key is not the certificate's".to_string()
            }
            e => e.to_string(),
        };
        format!(
            "{} and {}: {why}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    Ok(Arc::new(config))
}

/// TLS for a cluster's node link, from the same files: the node serves its link with its
/// certificate and requires the dialler's, and dials with its certificate as the client's;
/// both sides verify against `files.client_ca`, which it needs.
pub fn link_tls(files: &TlsFiles) -> Result<leasemq_replica::LinkTls, String> {
    let Some(ca) = &files.client_ca else {
        return Err(
            "the node link's TLS needs --tls-client-ca: the CA of the nodes' certificates".into(),
        );
    };
    let server = server_config(files)?;
    let provider = Arc::new(aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("{}: no PEM private key read: {e}", files.key.display()))?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(read_certs(&files.cert)?, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    Ok(leasemq_replica::LinkTls {
        acceptor: TlsAcceptor::from(server),
        connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
    })
}

/// The certificates of the PEM file at `path`: at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The subject CN of a DER certificate (the user an EXTERNAL login is), if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}
