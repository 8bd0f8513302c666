//! The rebalancer's requests, cut down to what it needs of the answers. A page of a
//! metadata-only list is parsed to what planning a move needs: name, namespace, labels,
//! resourceVersion and ownerReferences. The apiserver sends every object's managedFields (and
//! annotations) with its metadata; they are skipped while parsing instead of being built into
//! values and dropped, so a page costs a fraction of the memory (and time) a full `ObjectMeta`
//! page does. A write asks for the object's metadata only in its answer, and skips even that.

use std::collections::BTreeMap;

use futures::AsyncReadExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, Request, Resource};
use serde::Deserialize;

use super::Target;

/// A page of objects.
#[derive(Debug, Default, PartialEq)]
pub struct Page {
    /// The objects' metadata (only the fields named in the module docs are set).
    pub items: Vec<ObjectMeta>,
    /// The token of the next page; `None` on the last one.
    pub continue_token: Option<String>,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    metadata: ListMeta,
    /// `null` when the list is empty (the apiserver's nil slice).
    #[serde(default)]
    items: Option<Vec<Item>>,
}

#[derive(Default, Deserialize)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl From<Meta> for ObjectMeta {
    fn from(meta: Meta) -> Self {
        ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            labels: meta.labels,
            resource_version: meta.resource_version,
            owner_references: meta.owner_references,
            ..ObjectMeta::default()
        }
    }
}

/// Parses a `PartialObjectMetadataList` (or any list) body into a [`Page`].
pub fn parse(body: &[u8]) -> Result<Page, serde_json::Error> {
    let list: List = serde_json::from_slice(body)?;
    Ok(Page {
        items: list
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|item| item.metadata.into())
            .collect(),
        continue_token: list.metadata.continue_.filter(|t| !t.is_empty()),
    })
}

/// Lists one page of `api`'s objects in every namespace, metadata only.
pub async fn list(
    client: &Client,
    api: &ApiResource,
    params: &ListParams,
) -> Result<Page, kube::Error> {
    let request = Request::new(DynamicObject::url_path(api, None))
        .list_metadata(params)
        .map_err(kube::Error::BuildRequest)?;
    // Read into one buffer (no text copy of it), parsed as it is.
    let mut body = Vec::new();
    client
        .request_stream(request)
        .await?
        .read_to_end(&mut body)
        .await
        .map_err(kube::Error::ReadEvents)?;
    parse(&body).map_err(kube::Error::SerdeError)
}

/// Merge-patches object `name` of `target` (in `namespace`) with `patch`; the answer (the
/// object's metadata) is read and dropped unparsed.
pub async fn patch(
    client: &Client,
    target: &Target,
    namespace: Option<&str>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let namespace = namespace.filter(|_| target.namespaced);
    let request = Request::new(DynamicObject::url_path(&target.api, namespace))
        .patch_metadata(name, &PatchParams::default(), &Patch::Merge(patch))
        .map_err(kube::Error::BuildRequest)?;
    client
        .request::<serde::de::IgnoredAny>(request)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_page_keeps_what_a_move_needs_and_drops_the_rest() {
        let body = json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "42", "continue": "next-page"},
            "items": [
                {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {
                        "name": "child",
                        "namespace": "ns",
                        "uid": "u-1",
                        "resourceVersion": "41",
                        "labels": {"a": "b"},
                        "annotations": {"big": "x".repeat(1000)},
                        "ownerReferences": [{
                            "apiVersion": "v1", "kind": "Secret", "name": "owner",
                            "uid": "u-0", "controller": true
                        }],
                        "managedFields": [{
                            "manager": "kubectl", "operation": "Update",
                            "fieldsType": "FieldsV1",
                            "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}
                        }]
                    }
                },
                {"metadata": {"name": "bare"}}
            ]
        });
        let page = parse(body.to_string().as_bytes()).expect("page");
        assert_eq!(page.continue_token.as_deref(), Some("next-page"));
        assert_eq!(page.items.len(), 2);
        let child = &page.items[0];
        assert_eq!(child.name.as_deref(), Some("child"));
        assert_eq!(child.namespace.as_deref(), Some("ns"));
        assert_eq!(child.resource_version.as_deref(), Some("41"));
        assert_eq!(
            child
                .labels
                .as_ref()
                .and_then(|l| l.get("a"))
                .map(String::as_str),
            Some("b")
        );
        let owner = &child.owner_references.as_ref().expect("owners")[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("owner", Some(true))
        );
        assert!(child.managed_fields.is_none() && child.annotations.is_none());
        assert!(child.uid.is_none(), "only what a move needs");
        assert_eq!(page.items[1].name.as_deref(), Some("bare"));
    }

    #[test]
    fn the_last_page_has_no_continue_token() {
        for body in [
            json!({"metadata": {"continue": ""}, "items": []}),
            json!({"metadata": {}, "items": []}),
            // An empty list as the apiserver sends it: a nil slice.
            json!({"metadata": {"resourceVersion": "7"}, "items": null}),
            json!({"metadata": {}}),
        ] {
            let page = parse(body.to_string().as_bytes()).expect("page");
            assert_eq!(page, Page::default(), "{body}");
        }
    }

    #[test]
    fn a_malformed_body_is_an_error_not_an_empty_page() {
        assert!(parse(b"{\"items\": 3}").is_err());
        assert!(parse(b"not json").is_err());
    }
}
