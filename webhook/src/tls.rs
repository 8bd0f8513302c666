//! The serving certificate: loaded from PEM files and reloaded when their contents change.
//!
//! The files are re-read every `--tls-reload-interval`; a pair that does not load (for example
//! the certificate already replaced but not yet the key) keeps the previous certificate in
//! service and is retried on the next tick.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::Error;

/// The PEM bytes of a certificate chain and its key, as read from the files.
pub type PemPair = (Vec<u8>, Vec<u8>);

/// The certificate and key files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM certificate chain (`--tls-cert-file`).
    pub cert: PathBuf,
    /// PEM private key (`--tls-key-file`).
    pub key: PathBuf,
}

fn read(path: &Path, flag: &'static str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Tls {
        flag,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

impl TlsFiles {
    fn read(&self) -> Result<PemPair, Error> {
        Ok((
            read(&self.cert, "--tls-cert-file")?,
            read(&self.key, "--tls-key-file")?,
        ))
    }

    /// Builds a server config (TLS 1.2 and 1.3, ALPN h2 and http/1.1) from PEM bytes.
    pub fn server_config(&self, cert: &[u8], key: &[u8]) -> Result<ServerConfig, Error> {
        let tls_err = |flag, path: &Path, reason: String| Error::Tls {
            flag,
            path: path.to_owned(),
            reason,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| tls_err("--tls-cert-file", &self.cert, e.to_string()))?;
        if certs.is_empty() {
            return Err(tls_err(
                "--tls-cert-file",
                &self.cert,
                "no CERTIFICATE block found".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| tls_err("--tls-key-file", &self.key, e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("--tls-cert-file", &self.cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                tls_err(
                    "--tls-key-file",
                    &self.key,
                    format!("does not match the certificate: {e}"),
                )
            })?;
        // kube-apiserver calls webhooks over HTTP/1.1 (since 1.16; HTTP/2 only to loopback URLs
        // since 1.30), a connection per call in flight and at most 25 kept idle; h2 is there for
        // the clients that ask for it.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Loads the files once; the error names the flag whose file is wrong.
    pub fn load(&self) -> Result<(RustlsConfig, PemPair), Error> {
        let (cert, key) = self.read()?;
        let config = self.server_config(&cert, &key)?;
        Ok((RustlsConfig::from_config(Arc::new(config)), (cert, key)))
    }
}

/// Re-reads the files every `interval` until `shutdown` and swaps in a new certificate when the
/// contents change and load ([`sharder_runtime::files::reload_on_change`]). New connections get
/// the new certificate; open ones keep theirs.
pub async fn reload_on_change(
    files: TlsFiles,
    config: RustlsConfig,
    loaded: PemPair,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    sharder_runtime::files::reload_on_change(
        "the TLS files",
        interval,
        loaded,
        || files.read(),
        |(cert, key)| {
            let server_config = files.server_config(cert, key)?;
            config.reload_from_config(Arc::new(server_config));
            info!(cert = %files.cert.display(), "serving certificate reloaded");
            Ok(())
        },
        shutdown,
    )
    .await;
    Ok(())
}
