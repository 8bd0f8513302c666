//! A list page parsed as its bytes arrive: each object is handed over as soon as its text is
//! complete, cut down to what a move needs (name, namespace, resourceVersion, ownerReferences,
//! and of the labels only the shard and drain labels). The apiserver sends every object's
//! managedFields, annotations and other labels with its metadata; they are skipped while
//! parsing. What the scanner holds is the unparsed rest of the body read so far (at most one
//! object's text and the piece that came with it), so memory does not depend on the page size.
//!
//! The scanner follows the top level of a list (`{"kind": .., "metadata": {"continue": ..},
//! "items": [..]}`, keys in any order) by itself and lets `serde_json` parse (and validate) each
//! top-level value and each object. It is pure: fed the same bytes cut at any points, it hands
//! over the same objects (property-tested).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use sharder_common::labels::is_sharding_label;

/// Parses one list response body, fed in pieces.
#[derive(Debug, Default)]
pub struct PageScanner {
    /// What was read and not consumed yet.
    buf: Vec<u8>,
    /// How far `buf` is consumed.
    pos: usize,
    state: State,
    /// The list's `metadata` has been read.
    metadata_read: bool,
    continue_token: Option<String>,
    /// The search for the end of the value at `pos`.
    scan: ValueScan,
}

/// Where in the top level of the list the scanner is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Before the opening `{`.
    #[default]
    Start,
    /// Before a key (after `{` or `,`).
    Key,
    /// After the key `field`, before `:`.
    Colon(Field),
    /// Before the value of `field`.
    Value(Field),
    /// After a value, before `,` or `}`.
    AfterValue,
    /// Before the value of `items`: `[` or `null`.
    ItemsOpen,
    /// After `[`: an object or `]`.
    FirstItem,
    /// Before an object of `items`.
    Item,
    /// After an object of `items`: `,` or `]`.
    AfterItem,
    /// After the closing `}`.
    Done,
}

/// The top-level fields the scanner reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Items,
    Metadata,
    Other,
}

fn error(message: impl fmt::Display) -> serde_json::Error {
    serde_json::Error::custom(message)
}

impl PageScanner {
    /// Feeds the next piece of the body; the objects completed by it are pushed onto `out`.
    pub fn feed(
        &mut self,
        piece: &[u8],
        out: &mut Vec<ObjectMeta>,
    ) -> Result<(), serde_json::Error> {
        self.buf.extend_from_slice(piece);
        while self.step(out)? {}
        // Keep only what is not consumed (part of one value at most).
        self.buf.drain(..self.pos);
        self.pos = 0;
        Ok(())
    }

    /// The token of the next page as soon as the list's `metadata` has been read (`Some(None)`
    /// on the last page), `None` before. kube-apiserver writes `metadata` before `items`, so
    /// the next page can be requested while this one's objects are still arriving.
    pub fn continue_token(&self) -> Option<Option<&str>> {
        self.metadata_read.then_some(self.continue_token.as_deref())
    }

    /// Ends the body: the token of the next page (`None` on the last page), or an error if the
    /// body ended before the list did.
    pub fn finish(mut self) -> Result<Option<String>, serde_json::Error> {
        self.skip_whitespace();
        match (self.state, self.pos == self.buf.len()) {
            (State::Done, true) => Ok(self.continue_token),
            (State::Done, false) => Err(error("trailing characters after the list")),
            (state, _) => Err(error(format!(
                "the list ended early (truncated while reading {state:?})"
            ))),
        }
    }

    fn skip_whitespace(&mut self) {
        while self
            .buf
            .get(self.pos)
            .is_some_and(|b| b.is_ascii_whitespace())
        {
            self.pos += 1;
        }
    }

    /// One step of the top level; `false` when more bytes are needed.
    fn step(&mut self, out: &mut Vec<ObjectMeta>) -> Result<bool, serde_json::Error> {
        self.skip_whitespace();
        let Some(&byte) = self.buf.get(self.pos) else {
            return Ok(false);
        };
        let expect = |want: u8, state: State| {
            if byte == want {
                Ok(())
            } else {
                Err(error(format!(
                    "expected '{}' in the list at {state:?}, found '{}'",
                    want as char,
                    byte.escape_ascii()
                )))
            }
        };
        match self.state {
            State::Start => {
                expect(b'{', self.state)?;
                self.pos += 1;
                self.state = State::Key;
            }
            State::Key => {
                expect(b'"', self.state)?;
                let Some(end) = self.scan.end(&self.buf, self.pos)? else {
                    return Ok(false);
                };
                let key: std::borrow::Cow<'_, str> =
                    serde_json::from_slice(&self.buf[self.pos..end])?;
                let field = match key.as_ref() {
                    "items" => Field::Items,
                    "metadata" => Field::Metadata,
                    _ => Field::Other,
                };
                self.pos = end;
                self.state = State::Colon(field);
            }
            State::Colon(field) => {
                expect(b':', self.state)?;
                self.pos += 1;
                self.state = match field {
                    Field::Items => State::ItemsOpen,
                    _ => State::Value(field),
                };
            }
            State::Value(field) => {
                let Some(end) = self.scan.end(&self.buf, self.pos)? else {
                    return Ok(false);
                };
                let value = &self.buf[self.pos..end];
                if field == Field::Metadata {
                    let meta: ListMeta = serde_json::from_slice(value)?;
                    self.continue_token = meta.continue_.filter(|t| !t.is_empty());
                    self.metadata_read = true;
                } else {
                    serde_json::from_slice::<IgnoredAny>(value)?;
                }
                self.pos = end;
                self.state = State::AfterValue;
            }
            // After a member of the list object or an element of `items`: a comma leads to the
            // next one, the closing bracket out.
            State::AfterValue | State::AfterItem => {
                let (next, close, closed) = if self.state == State::AfterValue {
                    (State::Key, b'}', State::Done)
                } else {
                    (State::Item, b']', State::AfterValue)
                };
                if byte != b',' {
                    expect(close, self.state)?;
                }
                self.pos += 1;
                self.state = if byte == b',' { next } else { closed };
            }
            State::ItemsOpen => match byte {
                b'[' => {
                    self.pos += 1;
                    self.state = State::FirstItem;
                }
                // An empty list as the apiserver sends it: a nil slice.
                b'n' => {
                    let Some(end) = self.scan.end(&self.buf, self.pos)? else {
                        return Ok(false);
                    };
                    serde_json::from_slice::<()>(&self.buf[self.pos..end])?;
                    self.pos = end;
                    self.state = State::AfterValue;
                }
                _ => expect(b'[', self.state)?,
            },
            State::FirstItem if byte == b']' => {
                self.pos += 1;
                self.state = State::AfterValue;
            }
            State::FirstItem | State::Item => {
                let Some(end) = self.scan.end(&self.buf, self.pos)? else {
                    return Ok(false);
                };
                let item: Item = serde_json::from_slice(&self.buf[self.pos..end])?;
                out.push(item.metadata.into());
                self.pos = end;
                self.state = State::AfterItem;
            }
            State::Done => return Err(error("trailing characters after the list")),
        }
        Ok(true)
    }
}

/// How far the search for the end of the JSON value at the scanner's position got: kept
/// while the value's text is still arriving, so a value longer than a read (an object with big
/// annotations, say) is scanned once, not again from its start with every read.
#[derive(Clone, Copy, Debug, Default)]
struct ValueScan {
    /// Bytes of the value scanned so far.
    scanned: usize,
    /// Objects and arrays open.
    depth: usize,
    in_string: bool,
    /// After a backslash in a string.
    escaped: bool,
}

impl ValueScan {
    /// Where the JSON value starting at `buf[start]` ends (exclusive), or `None` if `buf` holds
    /// only part of it (the scan goes on from there next time). Objects and arrays are matched
    /// by nesting (strings skipped); `serde_json` checks the value itself afterwards.
    fn end(&mut self, buf: &[u8], start: usize) -> Result<Option<usize>, serde_json::Error> {
        let first = buf[start];
        let from = start + self.scanned.max(1);
        let found = match first {
            b'{' | b'[' | b'"' => {
                if self.scanned == 0 {
                    self.depth = usize::from(first != b'"');
                    self.in_string = first == b'"';
                }
                self.nested_end(&buf[from..])
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => buf[from..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace()),
            other => {
                return Err(error(format!(
                    "unexpected character '{}' in the list",
                    other.escape_ascii()
                )));
            }
        };
        Ok(match found {
            Some(n) => {
                *self = Self::default();
                Some(from + n)
            }
            None => {
                self.scanned = buf.len() - start;
                None
            }
        })
    }

    /// Where in `rest` (which follows what was scanned) the value ends: just past its closing
    /// byte.
    fn nested_end(&mut self, rest: &[u8]) -> Option<usize> {
        for (i, &b) in rest.iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
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
    metadata: Waiting,
}

/// The metadata fields a move needs, as the scanner keeps them and as a listed object waits
/// for a write slot: in 112 bytes and their strings instead of an [`ObjectMeta`]'s 360 and the
/// half-KiB node of its label map (up to a page of these wait at once). Converting to an
/// `ObjectMeta` and back gives the same value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
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

impl From<ObjectMeta> for Waiting {
    fn from(meta: ObjectMeta) -> Self {
        Self {
            name: meta.name,
            namespace: meta.namespace,
            resource_version: meta.resource_version,
            labels: meta.labels.map(|l| l.into_iter().collect()),
            owner_references: meta.owner_references,
        }
    }
}

impl From<Waiting> for ObjectMeta {
    fn from(waiting: Waiting) -> Self {
        ObjectMeta {
            name: waiting.name,
            namespace: waiting.namespace,
            resource_version: waiting.resource_version,
            labels: waiting.labels.map(|l| l.into_vec().into_iter().collect()),
            owner_references: waiting.owner_references,
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

    /// Feeds `body` cut at `cuts` (offsets, any order) and finishes.
    fn scan(body: &[u8], cuts: &[usize]) -> Result<(Vec<ObjectMeta>, Option<String>), String> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(body.len());
        let mut scanner = PageScanner::default();
        let mut out = Vec::new();
        let mut from = 0;
        for cut in cuts {
            scanner
                .feed(&body[from..cut], &mut out)
                .map_err(|e| e.to_string())?;
            from = cut;
        }
        let token = scanner.finish().map_err(|e| e.to_string())?;
        Ok((out, token))
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
        let ring = RingLabels::new("example");
        let body = page(
            vec![
                item("child", &ring, "shard-1"),
                json!({"metadata": {"name": "bare"}}),
            ],
            "next",
        );
        let (items, token) = scan(&body, &[]).expect("page");
        assert_eq!(token.as_deref(), Some("next"));
        assert_eq!(items.len(), 2);
        let child = &items[0];
        assert_eq!(child.name.as_deref(), Some("child"));
        assert_eq!(child.namespace.as_deref(), Some("ns"));
        assert_eq!(child.resource_version.as_deref(), Some("41"));
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
            let (items, token) = scan(body.to_string().as_bytes(), &[]).expect("page");
            assert!(items.is_empty() && token.is_none(), "{body}");
        }
    }

    #[test]
    fn the_continue_token_is_read_wherever_the_metadata_stands() {
        let body = json!({"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t"}, "kind": "X"});
        let (items, token) = scan(body.to_string().as_bytes(), &[3, 17]).expect("page");
        assert_eq!((items.len(), token.as_deref()), (1, Some("t")));
    }

    #[test]
    fn the_continue_token_is_known_once_the_metadata_was_read_before_any_object() {
        let ring = RingLabels::new("r");
        // In kube-apiserver's order (`json!` would sort the keys).
        let items: Vec<Value> = (0..3)
            .map(|i| item(&format!("o-{i}"), &ring, "s"))
            .collect();
        let body = format!(
            r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{{"resourceVersion":"42","continue":"next"}},"items":{}}}"#,
            Value::from(items)
        )
        .into_bytes();
        let items_at = body
            .windows(7)
            .position(|w| w == b"\"items\"")
            .expect("items");
        let mut scanner = PageScanner::default();
        let mut out = Vec::new();
        scanner.feed(&body[..5], &mut out).expect("feed");
        assert_eq!(scanner.continue_token(), None, "not read yet");
        scanner.feed(&body[5..items_at], &mut out).expect("feed");
        assert_eq!(scanner.continue_token(), Some(Some("next")));
        assert!(out.is_empty(), "known before any object");
        let mut last = PageScanner::default();
        last.feed(&page(Vec::new(), ""), &mut out).expect("feed");
        assert_eq!(last.continue_token(), Some(None), "the last page says so");
    }

    #[test]
    fn objects_are_handed_over_as_soon_as_their_text_is_complete() {
        let ring = RingLabels::new("r");
        let body = page(
            (0..3)
                .map(|i| item(&format!("o-{i}"), &ring, "s"))
                .collect(),
            "",
        );
        let first_end = body
            .windows(4)
            .position(|w| w == b"o-1\"")
            .expect("second object");
        let mut scanner = PageScanner::default();
        let mut out = Vec::new();
        scanner.feed(&body[..first_end], &mut out).expect("feed");
        assert_eq!(out.len(), 1, "the first object is out before the page ends");
        scanner.feed(&body[first_end..], &mut out).expect("feed");
        assert_eq!(out.len(), 3);
        assert!(scanner.buf.is_empty(), "nothing is held once consumed");
        assert_eq!(scanner.finish().expect("finish"), None);
    }

    #[test]
    fn malformed_or_truncated_bodies_are_errors_not_short_pages() {
        let ring = RingLabels::new("r");
        let good = page(vec![item("a", &ring, "s")], "t");
        let truncated = &good[..good.len() - 3];
        for (body, want) in [
            (truncated.to_vec(), "ended early"),
            (b"".to_vec(), "ended early"),
            (b"not json".to_vec(), "expected '{'"),
            (b"{\"items\": 3}".to_vec(), "expected '['"),
            (
                b"{\"items\": [{\"metadata\": {\"name\": 5}}]}".to_vec(),
                "invalid type",
            ),
            (
                b"{\"metadata\": {\"continue\": 1}}".to_vec(),
                "invalid type",
            ),
            (b"{\"kind\": tru}".to_vec(), "while parsing a value"),
            (b"{\"items\": []} {}".to_vec(), "trailing"),
            (b"{\"items\": [] \"kind\": 1}".to_vec(), "expected '}'"),
        ] {
            let err = scan(&body, &[]).expect_err(&String::from_utf8_lossy(&body));
            assert!(err.contains(want), "{err} should say {want}");
        }
    }

    proptest! {
        #[test]
        fn any_cut_of_a_page_gives_the_same_objects_as_the_whole(
            cuts in proptest::collection::vec(0usize..100_000, 0..12),
            names in proptest::collection::vec("[a-z0-9.-]{1,20}", 0..8),
            token in "[A-Za-z0-9=]{0,12}",
        ) {
            let ring = RingLabels::new("prop");
            let body = page(names.iter().map(|n| item(n, &ring, "shard-0")).collect(), &token);
            let whole = scan(&body, &[]).expect("whole");
            let cut = scan(&body, &cuts).expect("cut");
            prop_assert_eq!(&whole, &cut);
            let got: Vec<_> = whole.0.iter().map(|m| m.name.clone().unwrap_or_default()).collect();
            prop_assert_eq!(got, names);
            prop_assert_eq!(whole.1, (!token.is_empty()).then_some(token));
            for meta in whole.0 {
                prop_assert_eq!(ObjectMeta::from(Waiting::from(meta.clone())), meta);
            }
        }
    }

    #[test]
    fn a_waiting_object_converts_back_to_the_same_metadata() {
        let ring = RingLabels::new("ring");
        let child = ObjectMeta {
            name: Some("child".into()),
            namespace: Some("ns".into()),
            resource_version: Some("42".into()),
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
            assert_eq!(ObjectMeta::from(Waiting::from(meta.clone())), meta);
        }
    }
}
