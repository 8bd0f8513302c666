//! The CA bundle written into every webhook configuration's `caBundle`: read from
//! `--webhook-ca-file` at start (a file without a certificate is an error naming the flag), then
//! re-read every `--webhook-ca-reload-interval`; a changed bundle that parses is published to the
//! webhook configuration controller, which updates every ring's configuration.
//!
//! Rotating the webhook's CA without a failed call: put the old and the new CA into the file,
//! wait until the configurations carry both, switch the webhook's serving certificate, then drop
//! the old CA from the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::Error;

fn invalid(path: &Path, reason: String) -> Error {
    Error::CaBundle {
        path: path.to_owned(),
        reason,
    }
}

/// Checks that `pem` holds at least one certificate and nothing unparsable.
pub(crate) fn check(path: &Path, pem: &[u8]) -> Result<(), Error> {
    let mut certificates = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| invalid(path, e.to_string()))?;
        certificates += 1;
    }
    if certificates == 0 {
        return Err(invalid(path, "no CERTIFICATE block found".into()));
    }
    Ok(())
}

/// Reads and checks the bundle at `path`.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, Error> {
    let pem = std::fs::read(path).map_err(|source| Error::CaFile {
        path: path.to_owned(),
        source,
    })?;
    check(path, &pem)?;
    Ok(pem)
}

/// Re-reads `path` every `interval` until `shutdown` and publishes changed bundles that parse on
/// `bundle` (whose current value is the loaded one).
pub(crate) async fn reload_on_change(
    path: PathBuf,
    bundle: watch::Sender<Vec<u8>>,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let loaded = bundle.borrow().clone();
    sharder_runtime::files::reload_on_change(
        "the webhook CA file",
        interval,
        loaded,
        || {
            std::fs::read(&path).map_err(|source| Error::CaFile {
                path: path.clone(),
                source,
            })
        },
        |pem| {
            check(&path, pem)?;
            bundle.send_replace(pem.clone());
            info!(ca_file = %path.display(), "webhook CA bundle reloaded");
            Ok(())
        },
        shutdown,
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0Ftd3b7ALVsJv3JpZxJrV+Lq3cwCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----\n";

    #[test]
    fn a_bundle_needs_a_certificate_and_nothing_broken() {
        let path = Path::new("/etc/ca.crt");
        assert!(check(path, CERT.as_bytes()).is_ok());
        assert!(check(path, format!("{CERT}{CERT}").as_bytes()).is_ok());
        let empty = check(path, b"").expect_err("empty").to_string();
        assert_eq!(
            empty,
            "--webhook-ca-file /etc/ca.crt: no CERTIFICATE block found"
        );
        let broken = check(path, b"-----BEGIN CERTIFICATE-----\n!!!\n")
            .expect_err("broken")
            .to_string();
        assert!(
            broken.starts_with("--webhook-ca-file /etc/ca.crt: "),
            "{broken}"
        );
    }
}
