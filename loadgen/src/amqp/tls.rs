//! `--tls-ca FILE`: how a run trusts the servers of its `amqps://` targets, for lapin
//! (the CA as PEM) and for the raw client (a rustls client config).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::aws_lc_rs;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The CA the servers' certificates must chain to.
#[derive(Clone)]
pub(crate) struct ClientTls {
    /// The CA certificates, PEM, as lapin takes them.
    pub(crate) ca_pem: String,
    /// The raw client's config: TLS 1.3 and 1.2, the CA as the only root.
    pub(crate) config: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// Reads the CA file at `path`: an error names it and what is wrong.
    pub(crate) fn load(path: &Path) -> Result<ClientTls, String> {
        let named = |e: &dyn std::fmt::Display| format!("--tls-ca {}: {e}", path.display());
        let ca_pem = std::fs::read_to_string(path).map_err(|e| named(&e))?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots
                .add(cert.map_err(|e| named(&e))?)
                .map_err(|e| named(&e))?;
        }
        if roots.is_empty() {
            return Err(named(&"no PEM certificate in it"));
        }
        let config = ClientConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| named(&e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls {
            ca_pem,
            config: Arc::new(config),
        })
    }
}
