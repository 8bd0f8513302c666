//! A throwaway certificate authority for TLS servers started by tests (webhooks on loopback).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

use crate::Error;

fn rcgen_err(e: rcgen::Error) -> Error {
    Error::Provision(format!("cannot make a test certificate: {e}"))
}

/// A CA that signs serving certificates for `127.0.0.1` and `localhost`.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A serving certificate and its key, PEM-encoded.
#[derive(Clone, Debug)]
pub struct ServingCert {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PEM, PKCS#8).
    pub key_pem: String,
}

impl ServingCert {
    /// Writes the certificate and key as `tls.crt` and `tls.key` in `dir` (the files of a
    /// mounted `kubernetes.io/tls` Secret); their paths.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Result<Self, Error> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(rcgen_err)?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(rcgen_err)?;
        Ok(Self { issuer })
    }

    /// The CA certificate (PEM), for `caBundle` or a client's root store.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `127.0.0.1`, `::1` and `localhost` with common name `cn`.
    pub fn serving_cert(&self, cn: &str) -> Result<ServingCert, Error> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).map_err(rcgen_err)?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()));
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().map_err(rcgen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(rcgen_err)?;
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
