//! A list page parsed into what a move needs: each object cut down to its name, namespace,
//! resourceVersion, creation time, ownerReferences and, of its labels, only the shard and drain
//! labels (the apiserver sends every object's managedFields, annotations and other labels with
//! its metadata; they are skipped while parsing), and the token of the next page.
//!
//! A page is read whole, kept as the chunks it arrived in ([`Chunks`]) and parsed with one
//! `serde_json::from_reader` that frees each chunk once it is read: kube's `request_text` would
//! copy the chunks into one piece and that piece into a `String` first (the choice against a
//! streaming scanner: `docs/performance-notes.md`, "Transport and memory").

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufReader, Read};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::ObjectMeta;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use sharder_common::labels::is_sharding_label;

/// One list page: its objects, cut down to what a move needs, and the token of the next page
/// (`None` on the last).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ParsedPage {
    /// The page's objects, in order.
    pub objects: Vec<ListedMeta>,
    /// The token of the next page.
    pub continue_token: Option<String>,
}

/// Parses a metadata-only list response body.
pub(crate) fn parse(body: impl Read) -> Result<ParsedPage, serde_json::Error> {
    #[derive(Deserialize)]
    struct List {
        #[serde(default)]
        metadata: Option<ListMeta>,
        #[serde(default)]
        items: Option<Vec<Item>>,
    }
    let list: List = serde_json::from_reader(BufReader::new(body))?;
    Ok(ParsedPage {
        objects: list
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|item| item.metadata)
            .collect(),
        continue_token: list
            .metadata
            .and_then(|m| m.continue_)
            .filter(|t| !t.is_empty()),
    })
}

/// A response body as the chunks it arrived in, each freed once it is parsed: the page is
/// held once, not copied into one piece first.
#[derive(Debug, Default)]
pub(crate) struct Chunks {
    chunks: VecDeque<Vec<u8>>,
    /// How much of the first chunk was read.
    at: usize,
}

impl Chunks {
    /// Adds the next chunk of the body.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.chunks.push_back(chunk.to_vec());
    }
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(first) = self.chunks.front() {
            let n = (&first[self.at..]).read(buf)?;
            if n > 0 || buf.is_empty() {
                self.at += n;
                return Ok(n);
            }
            self.chunks.pop_front();
            self.at = 0;
        }
        Ok(0)
    }
}

#[derive(Deserialize)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    metadata: ListedMeta,
}

/// The metadata fields a move needs (and the creation time, for the count of objects no shard
/// holds), as a page is parsed into and as a listed object waits for a write slot: a fraction of
/// an [`ObjectMeta`] and the node of its label map (up to a page of these wait at once).
/// Converting to an `ObjectMeta` and back gives the same value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    /// The shard and drain labels (others are skipped while parsing).
    #[serde(default, deserialize_with = "sharding_labels")]
    labels: Option<Labels>,
    owner_references: Option<Vec<OwnerReference>>,
}

/// Labels as pairs: a couple of them fit in far less than a map's node.
type Labels = Box<[(String, String)]>;

fn sharding_labels<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Labels>, D::Error> {
    Ok(Option::<ShardingLabels>::deserialize(deserializer)?.map(|l| l.0))
}

impl From<ObjectMeta> for ListedMeta {
    fn from(meta: ObjectMeta) -> Self {
        Self {
            name: meta.name,
            namespace: meta.namespace,
            resource_version: meta.resource_version,
            creation_timestamp: meta.creation_timestamp,
            labels: meta.labels.map(|l| l.into_iter().collect()),
            owner_references: meta.owner_references,
        }
    }
}

impl From<ListedMeta> for ObjectMeta {
    fn from(listed: ListedMeta) -> Self {
        ObjectMeta {
            name: listed.name,
            namespace: listed.namespace,
            resource_version: listed.resource_version,
            creation_timestamp: listed.creation_timestamp,
            labels: listed.labels.map(|l| l.into_vec().into_iter().collect()),
            owner_references: listed.owner_references,
            ..ObjectMeta::default()
        }
    }
}

/// The shard and drain labels of an object: other labels are skipped without being copied.
struct ShardingLabels(Labels);

impl<'de> Deserialize<'de> for ShardingLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Labels;
        impl<'de> Visitor<'de> for Labels {
            type Value = ShardingLabels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept = Vec::new();
                while let Some(key) = map.next_key_seed(SeenKey)? {
                    match key {
                        Some(key) => kept.push((key, map.next_value()?)),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(ShardingLabels(kept.into_boxed_slice()))
            }
        }
        deserializer.deserialize_map(Labels)
    }
}

/// A label key, copied only if it is a sharding label.
struct SeenKey;

impl<'de> DeserializeSeed<'de> for SeenKey {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for SeenKey {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a label key")
    }
    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(is_sharding_label(key).then(|| key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::{Value, json};
    use sharder_common::RingLabels;

    use super::*;

    /// Parses `body` into its objects (as `ObjectMeta`) and token.
    fn scan(body: &[u8]) -> Result<(Vec<ObjectMeta>, Option<String>), String> {
        let page = parse(body).map_err(|e| e.to_string())?;
        Ok((
            page.objects.into_iter().map(ObjectMeta::from).collect(),
            page.continue_token,
        ))
    }

    fn item(name: &str, ring: &RingLabels, shard: &str) -> Value {
        json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "uid": "u-1",
                "resourceVersion": "41",
                "creationTimestamp": "2026-12-03T08:00:00Z",
                "labels": {"app": "web", (ring.shard.as_str()): shard, (ring.drain.as_str()): "true"},
                "annotations": {"note": "braces } ] { [ and \"quotes\" \\ in a string"},
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Secret", "name": "owner",
                    "uid": "u-0", "controller": true
                }],
                "managedFields": [{
                    "manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}
                }]
            }
        })
    }

    fn page(items: Vec<Value>, token: &str) -> Vec<u8> {
        serde_json::to_vec_pretty(&json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "42", "continue": token},
            "items": items,
        }))
        .expect("json")
    }

    #[test]
    fn an_object_keeps_what_a_move_needs_and_only_the_sharding_labels() {
        let ring = sharder_common::RingId::cluster_ring("example").labels();
        let body = page(
            vec![
                item("child", &ring, "shard-1"),
                json!({"metadata": {"name": "bare"}}),
            ],
            "next",
        );
        let (items, token) = scan(&body).expect("page");
        assert_eq!(token.as_deref(), Some("next"));
        assert_eq!(items.len(), 2);
        let child = &items[0];
        assert_eq!(child.name.as_deref(), Some("child"));
        assert_eq!(child.namespace.as_deref(), Some("ns"));
        assert_eq!(child.resource_version.as_deref(), Some("41"));
        assert_eq!(
            child.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            Some("2026-12-03T08:00:00Z".to_owned())
        );
        let labels = child.labels.as_ref().expect("labels");
        assert_eq!(ring.shard_of(labels), Some("shard-1"));
        assert!(ring.is_draining(labels));
        assert!(!labels.contains_key("app"), "other labels are skipped");
        let owner = &child.owner_references.as_ref().expect("owners")[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("owner", Some(true))
        );
        assert!(
            child.managed_fields.is_none() && child.annotations.is_none() && child.uid.is_none()
        );
        assert_eq!(items[1].name.as_deref(), Some("bare"));
        assert!(items[1].labels.is_none());
    }

    #[test]
    fn the_last_page_has_no_continue_token_and_an_empty_list_may_be_null() {
        for body in [
            json!({"metadata": {"continue": ""}, "items": []}),
            json!({"metadata": {}, "items": []}),
            json!({"metadata": {"resourceVersion": "7"}, "items": null}),
            json!({"metadata": {}}),
            json!({"items": [], "metadata": {}}),
        ] {
            let (items, token) = scan(body.to_string().as_bytes()).expect("page");
            assert!(items.is_empty() && token.is_none(), "{body}");
        }
    }

    #[test]
    fn the_continue_token_is_read_wherever_the_metadata_stands() {
        let body = json!({"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t"}, "kind": "X"});
        let (items, token) = scan(body.to_string().as_bytes()).expect("page");
        assert_eq!((items.len(), token.as_deref()), (1, Some("t")));
    }

    #[test]
    fn malformed_or_truncated_bodies_are_errors_not_short_pages() {
        let ring = sharder_common::RingId::cluster_ring("r").labels();
        let good = page(vec![item("a", &ring, "s")], "t");
        let truncated = &good[..good.len() - 3];
        for (body, want) in [
            (truncated.to_vec(), "EOF while parsing"),
            (b"".to_vec(), "EOF while parsing"),
            (b"not json".to_vec(), "expected"),
            (b"{\"items\": 3}".to_vec(), "invalid type"),
            (
                b"{\"items\": [{\"metadata\": {\"name\": 5}}]}".to_vec(),
                "invalid type",
            ),
            (
                b"{\"metadata\": {\"continue\": 1}}".to_vec(),
                "invalid type",
            ),
            (b"{\"kind\": tru}".to_vec(), "expected"),
            (b"{\"items\": []} {}".to_vec(), "trailing"),
            (
                b"{\"items\": [] \"kind\": 1}".to_vec(),
                "expected `,` or `}`",
            ),
        ] {
            let err = scan(&body).expect_err(&String::from_utf8_lossy(&body));
            assert!(err.contains(want), "{err} should say {want}");
        }
    }

    proptest! {
        #[test]
        fn every_object_of_a_page_is_parsed_in_order_and_converts_back(
            names in proptest::collection::vec("[a-z0-9.-]{1,20}", 0..8),
            token in "[A-Za-z0-9=]{0,12}",
        ) {
            let ring = sharder_common::RingId::cluster_ring("prop").labels();
            let body = page(names.iter().map(|n| item(n, &ring, "shard-0")).collect(), &token);
            let (objects, continue_token) = scan(&body).expect("page");
            let got: Vec<_> = objects.iter().map(|m| m.name.clone().unwrap_or_default()).collect();
            prop_assert_eq!(got, names);
            prop_assert_eq!(continue_token, (!token.is_empty()).then_some(token));
            for meta in objects {
                prop_assert_eq!(ObjectMeta::from(ListedMeta::from(meta.clone())), meta);
            }
        }
    }

    proptest! {
        #[test]
        fn a_page_in_chunks_cut_anywhere_parses_as_the_whole_page(
            names in proptest::collection::vec("[a-z0-9.-]{1,20}", 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let ring = sharder_common::RingId::cluster_ring("prop").labels();
            let body = page(names.iter().map(|n| item(n, &ring, "shard-0")).collect(), "t");
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Chunks::default();
            let mut from = 0;
            for cut in cuts.into_iter().chain([body.len()]) {
                chunks.push(&body[from..cut]);
                from = cut;
            }
            prop_assert_eq!(parse(chunks).expect("chunks"), parse(&body[..]).expect("whole"));
        }
    }

    #[test]
    fn a_listed_object_converts_back_to_the_same_metadata() {
        let ring = sharder_common::RingId::cluster_ring("ring").labels();
        let child = ObjectMeta {
            name: Some("child".into()),
            namespace: Some("ns".into()),
            resource_version: Some("42".into()),
            creation_timestamp: Some(Time("2026-12-03T08:00:00Z".parse().expect("a time"))),
            labels: Some(
                [
                    (ring.shard.clone(), "shard-0".to_owned()),
                    (ring.drain.clone(), "true".to_owned()),
                ]
                .into(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Secret".into(),
                name: "owner".into(),
                uid: "uid-1".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        };
        let unlabelled = ObjectMeta {
            name: Some("plain".into()),
            labels: Some(BTreeMap::new()),
            ..ObjectMeta::default()
        };
        for meta in [child, unlabelled, ObjectMeta::default()] {
            assert_eq!(ObjectMeta::from(ListedMeta::from(meta.clone())), meta);
        }
    }
}
