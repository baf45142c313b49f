//! `--tls-cert`/`--tls-key`: checked whole before anything is served. A file that is not PEM,
//! holds no certificate or key, or a key that is not the certificate's is an exit-2 error
//! naming the file, never a panic or a server whose every handshake fails.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

use crate::exit::usage;

/// Largest certificate or key file read.
const PEM_LIMIT: u64 = 1 << 20;

/// The server's TLS configuration from a PEM certificate chain and its private key (PKCS#8,
/// PKCS#1 or SEC1).
pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let read = |path: &Path, what: &str| {
        virtprof_host::input::read_bytes(path, what, PEM_LIMIT).map_err(|e| usage(e.to_string()))
    };
    let (cert_pem, key_pem) = (read(cert_path, "TLS certificate")?, read(key_path, "TLS key")?);
    let (cert_name, key_name) = (cert_path.display(), key_path.display());
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(format!("--tls-cert '{cert_name}': not a PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(usage(format!(
            "--tls-cert '{cert_name}': no 'BEGIN CERTIFICATE' block (give the PEM certificate, then its chain)"
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        usage(format!(
            "--tls-key '{key_name}': no PEM private key ('BEGIN PRIVATE KEY', 'RSA PRIVATE KEY' or \
             'EC PRIVATE KEY'): {e}"
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => usage(format!(
                "--tls-key '{key_name}' is not the private key of --tls-cert '{cert_name}' (the first \
                 certificate must be the server's own)"
            )),
            rustls::Error::InvalidCertificate(_) | rustls::Error::InconsistentKeys(_) => {
                usage(format!("--tls-cert '{cert_name}': not a certificate rustls can use: {e}"))
            }
            other => usage(format!("--tls-key '{key_name}': not a key rustls can use: {other}")),
        })?;
    Ok(Arc::new(config))
}
