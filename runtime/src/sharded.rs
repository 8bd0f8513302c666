//! The apiserver's sharded list and watch (KEP-5866) for range mode: whether an apiserver
//! applies a `shardSelector` at all (with the `ShardedListAndWatch` gate off it ignores the
//! parameter and answers with every object, so it must be asked), and a client whose lists and
//! watches carry one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::client::Body;
use kube::core::Request;
use kube::{Client, Resource as _};
use sharder_common::ranges::ShardSelector;

/// The query parameter of a list or watch that carries the selector.
pub const PARAMETER: &str = "shardSelector";

/// A selector every apiserver with the gate refuses (a bound of 1 digit): its answer tells the
/// gate on (an error naming the invalid selector) from off (the list, as if it were not there).
const PROBE: &str = "shardRange(object.metadata.uid, '0x0', '0x1')";

/// What the gate-on answer to [`PROBE`] says.
const REFUSAL: &str = "invalid shard selector";

/// Whether the apiserver behind `client` applies `shardSelector` to lists of `resource`: asks
/// for one object with an invalid selector. A failure other than its refusal is an error.
pub async fn applies_selectors(
    client: &Client,
    resource: &ApiResource,
) -> Result<bool, kube::Error> {
    let mut request = Request::new(DynamicObject::url_path(resource, None))
        .list(&ListParams::default().limit(1))
        .map_err(kube::Error::BuildRequest)?;
    with_selector(&mut request, PROBE);
    match client.request_text(request).await {
        Ok(_) => Ok(false),
        Err(kube::Error::Api(status)) if status.message.contains(REFUSAL) => Ok(true),
        Err(e) => Err(e),
    }
}

/// A client that adds a `shardSelector` to every list and watch of the given resources (and
/// to nothing else), for the controllers of a shard in range mode.
#[derive(Clone)]
struct SelectorClient {
    inner: Client,
    selector: String,
    collections: Vec<String>,
}

impl SelectorClient {
    /// Whether `path` lists or watches one of the collections (across the cluster or in one
    /// namespace).
    fn selects(&self, path: &str) -> bool {
        self.collections.iter().any(|all| {
            path == all
                || path
                    .strip_prefix(all.rsplit_once('/').map_or("", |(base, _)| base))
                    .and_then(|rest| rest.strip_prefix("/namespaces/"))
                    .and_then(|rest| rest.split_once('/'))
                    .is_some_and(|(ns, plural)| {
                        !ns.is_empty() && Some(plural) == all.rsplit('/').next()
                    })
        })
    }
}

impl tower::Service<http::Request<Body>> for SelectorClient {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if request.method() == http::Method::GET && self.selects(request.uri().path()) {
            with_selector(&mut request, &self.selector);
        }
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(request).await })
    }
}

/// `client` with `selector` on the lists and watches of `resources`.
pub fn selecting_client(
    client: &Client,
    selector: &ShardSelector,
    resources: &[ApiResource],
) -> Client {
    let service = SelectorClient {
        inner: client.clone(),
        selector: selector.to_string(),
        collections: resources
            .iter()
            .map(|r| DynamicObject::url_path(r, None))
            .collect(),
    };
    Client::new(service, client.default_namespace().to_owned())
}

/// Adds `selector` to `request`'s query as [`PARAMETER`].
fn with_selector<B>(request: &mut http::Request<B>, selector: &str) {
    let uri = request.uri().to_string();
    let separator = if uri.contains('?') { '&' } else { '?' };
    let with = format!("{uri}{separator}{PARAMETER}={}", encode(selector));
    if let Ok(uri) = with.parse() {
        *request.uri_mut() = uri;
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;

    #[test]
    fn a_selector_is_added_to_the_query_percent_encoded() {
        for (uri, expected) in [
            ("/api/v1/configmaps", "/api/v1/configmaps?shardSelector="),
            (
                "/api/v1/configmaps?limit=1",
                "/api/v1/configmaps?limit=1&shardSelector=",
            ),
        ] {
            let mut request = http::Request::get(uri).body(()).expect("request");
            with_selector(
                &mut request,
                "shardRange(object.metadata.uid, '0x0', '0x1') || x",
            );
            assert_eq!(
                request.uri().to_string(),
                format!(
                    "{expected}shardRange%28object.metadata.uid%2C%20%270x0%27%2C%20%270x1%27%29%20%7C%7C%20x"
                )
            );
        }
    }

    #[tokio::test]
    async fn only_lists_and_watches_of_the_collections_carry_the_selector() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("url"));
        let client = SelectorClient {
            inner: Client::try_from(config).expect("client"),
            selector: String::new(),
            collections: vec![DynamicObject::url_path(
                &ApiResource::erase::<Secret>(&()),
                None,
            )],
        };
        for (path, selected) in [
            ("/api/v1/secrets", true),
            ("/api/v1/namespaces/ns-1/secrets", true),
            ("/api/v1/namespaces/ns-1/secrets/secrets", false),
            ("/api/v1/namespaces/ns-1/secrets/one", false),
            ("/api/v1/namespaces//secrets", false),
            ("/api/v1/configmaps", false),
            ("/api/v1/namespaces/ns-1/configmaps", false),
            ("/apis/coordination.k8s.io/v1/namespaces/ns-1/leases", false),
        ] {
            assert_eq!(client.selects(path), selected, "{path}");
        }
    }
}
