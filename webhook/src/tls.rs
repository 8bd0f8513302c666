//! The serving certificate: loaded from PEM files and reloaded when their contents change.
//!
//! Kubernetes updates Secret volumes by swapping a symlink (`..data`), which inotify on the file
//! path does not report; so the files are re-read every `--tls-reload-interval` and compared with
//! what was loaded. A pair that does not load (for example the certificate already replaced but
//! not yet the key) keeps the previous certificate in service and is retried on the next tick.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
/// contents change and load. New connections get the new certificate; open ones keep theirs.
pub async fn reload_on_change(
    files: TlsFiles,
    config: RustlsConfig,
    mut loaded: PemPair,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = ticker.tick() => {}
        }
        let current = match files.read() {
            Ok(current) => current,
            Err(e) => {
                warn!(error = %e, "cannot read the TLS files, keeping the loaded certificate");
                continue;
            }
        };
        if current == loaded {
            continue;
        }
        match files.server_config(&current.0, &current.1) {
            Ok(server_config) => {
                config.reload_from_config(Arc::new(server_config));
                loaded = current;
                info!(cert = %files.cert.display(), "serving certificate reloaded");
            }
            Err(e) => {
                warn!(error = %e, "changed TLS files do not load yet, keeping the loaded certificate");
            }
        }
    }
}
