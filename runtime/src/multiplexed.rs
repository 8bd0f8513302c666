//! A Kubernetes client that speaks HTTP/2 to the apiserver when it can: every request of the
//! client shares one connection (kube's own client speaks HTTP/1.1, one connection per request
//! in flight, each with its TLS session and buffers). For many small requests at once, such as
//! the reconciler's object writes, memory then no longer grows with how many are in flight.
//!
//! Built like kube's default client from the same configuration (KUBECONFIG or in-cluster:
//! server, TLS, credentials, impersonation headers), with two differences: HTTP/2 is offered
//! (ALPN `h2`, then `http/1.1`), and an overloaded apiserver's 429, 503 and 504 answers reach
//! the caller instead of being retried inside the client, so the caller can slow down.
//! Timeouts are the caller's (wrap requests in `tokio::time::timeout`).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt as _;
use tower::{BoxError, ServiceBuilder};

use crate::Error;

/// The multiplexed client from the environment (KUBECONFIG or in-cluster).
pub async fn client() -> Result<kube::Client, Error> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Client(kube::Error::InferConfig(e)))?;
    client_for(config)
}

/// The multiplexed client for `config`.
pub fn client_for(config: kube::Config) -> Result<kube::Client, Error> {
    let tls = config.rustls_client_config().map_err(Error::Client)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
            Error::Client(kube::Error::RustlsTls(
                kube::client::RustlsTlsError::InvalidServerName(e),
            ))
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_all_versions().wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}
