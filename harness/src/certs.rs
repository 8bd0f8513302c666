//! A throwaway certificate authority for TLS servers started by tests (webhooks on loopback).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The certificate a new TLS connection to `addr` is served (DER), trusting `roots` (PEM);
/// panics when the handshake fails.
pub async fn served_certificate(addr: SocketAddr, roots: &[String]) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    for pem in roots {
        store
            .add(rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem"))
            .expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(store)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = connector
        .connect(
            rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name"),
            tcp,
        )
        .await
        .expect("handshake");
    tls.get_ref()
        .1
        .peer_certificates()
        .expect("peer certificates")[0]
        .to_vec()
}

/// The DER bytes of the (first) certificate in `pem`.
pub fn der_of(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("pem")
        .to_vec()
}
