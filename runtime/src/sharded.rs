//! The apiserver's sharded list and watch (KEP-5866) for range mode: whether an apiserver
//! applies a `shardSelector` at all (with the `ShardedListAndWatch` gate off it ignores the
//! parameter and answers with every object, so it must be asked), and requests that carry one.

use kube::api::{ApiResource, DynamicObject, ListParams, ObjectList, PartialObjectMeta};
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

/// One page of the metadata of `resource`'s objects (in `namespace`, `None`: all) that
/// `selector` selects, as the apiserver answers it (check [`applies_selectors`] first).
pub async fn list_metadata(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    params: &ListParams,
    selector: &ShardSelector,
) -> Result<ObjectList<PartialObjectMeta<DynamicObject>>, kube::Error> {
    let mut request = Request::new(DynamicObject::url_path(resource, namespace))
        .list_metadata(params)
        .map_err(kube::Error::BuildRequest)?;
    with_selector(&mut request, &selector.to_string());
    client.request(request).await
}

/// Adds `selector` to `request`'s query as [`PARAMETER`].
pub fn with_selector<B>(request: &mut http::Request<B>, selector: &str) {
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
}
