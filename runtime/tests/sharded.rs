//! Range mode's facts against a real kube-apiserver: with the `ShardedListAndWatch` gate, the
//! apiserver selects for a shard's selecting client exactly the objects `sharder_common::ranges`
//! says its ranges hold, by uid and by namespace, so that each object is listed by one shard;
//! without the gate the probe says so (the apiserver would ignore a selector and send every
//! object).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, ListParams, PostParams};
use kube::{Api, ResourceExt};
use sharder_common::Ring;
use sharder_common::ranges::{
    RANGE_TOKENS_PER_SHARD, Range, RangeKey, ShardSelector, assign_namespaces, assign_uids,
};
use sharder_harness::ControlPlane;
use sharder_harness::control_plane::Options;
use sharder_runtime::sharded::{applies_selectors, selecting_client};

/// Creates `per_namespace` ConfigMaps in each of `namespaces` new namespaces; returns their
/// namespaces and, per ConfigMap, (namespace, name, uid).
async fn config_maps(
    cp: &ControlPlane,
    prefix: &str,
    namespaces: usize,
    per_namespace: usize,
) -> (Vec<String>, Vec<(String, String, String)>) {
    let client = cp.client().await.expect("client");
    let mut created = Vec::new();
    let mut names = Vec::new();
    for _ in 0..namespaces {
        let ns = cp.namespace(prefix).await.expect("namespace");
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        for i in 0..per_namespace {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("cm-{i}"));
            let cm = api
                .create(&PostParams::default(), &cm)
                .await
                .expect("create");
            created.push((ns.clone(), cm.name_any(), cm.uid().expect("uid")));
        }
        names.push(ns);
    }
    (names, created)
}

/// Per shard, the (namespace, name) of the objects of `namespaces` the apiserver lists for its
/// selector of `assignment`.
async fn listed_by_shard(
    cp: &ControlPlane,
    key: RangeKey,
    assignment: &BTreeMap<String, Vec<Range>>,
    namespaces: &[String],
) -> BTreeMap<(String, String), Vec<String>> {
    let client = cp.client().await.expect("client");
    let resource = ApiResource::erase::<ConfigMap>(&());
    let mut listed: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (shard, ranges) in assignment {
        let selector = ShardSelector::new(key, ranges.iter().copied());
        let selecting = selecting_client(&client, &selector, std::slice::from_ref(&resource));
        for ns in namespaces {
            let page = Api::<ConfigMap>::namespaced(selecting.clone(), ns)
                .list_metadata(&ListParams::default())
                .await
                .expect("list with a shard selector");
            for object in page.items {
                listed
                    .entry((ns.clone(), object.name_any()))
                    .or_default()
                    .push(shard.clone());
            }
        }
    }
    listed
}

/// The shard whose ranges of `key` select an object with `uid` in `namespace`.
fn owner(
    assignment: &BTreeMap<String, Vec<Range>>,
    key: RangeKey,
    uid: &str,
    namespace: &str,
) -> String {
    assignment
        .iter()
        .find(|(_, ranges)| {
            ShardSelector::new(key, ranges.iter().copied()).selects(uid, Some(namespace))
        })
        .map(|(shard, _)| shard.clone())
        .expect("a shard holds every hash")
}

#[tokio::test]
async fn the_apiserver_selects_by_uid_what_the_ranges_hold_each_object_once() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let resource = ApiResource::erase::<ConfigMap>(&());
    assert!(applies_selectors(&client, &resource).await.expect("probe"));
    let (namespaces, objects) = config_maps(cp, "ranges-uid", 2, 60).await;
    let ring = Ring::with_tokens(["shard-a", "shard-b", "shard-c"], RANGE_TOKENS_PER_SHARD);
    let assignment = assign_uids(&ring);
    let listed = listed_by_shard(cp, RangeKey::Uid, &assignment, &namespaces).await;
    let mut per_shard: BTreeMap<String, usize> = BTreeMap::new();
    for (ns, name, uid) in &objects {
        let owner = owner(&assignment, RangeKey::Uid, uid, ns);
        assert_eq!(
            listed.get(&(ns.clone(), name.clone())),
            Some(&vec![owner.clone()]),
            "{ns}/{name} (uid {uid})"
        );
        *per_shard.entry(owner).or_default() += 1;
    }
    assert_eq!(listed.len(), objects.len());
    assert_eq!(per_shard.len(), 3, "every shard lists some: {per_shard:?}");
}

#[tokio::test]
async fn the_apiserver_selects_by_namespace_what_the_ranges_hold_each_namespace_on_one_shard() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let (namespaces, objects) = config_maps(cp, "ranges-ns", 12, 3).await;
    let ring = Ring::with_tokens(["shard-a", "shard-b"], RANGE_TOKENS_PER_SHARD);
    let assignment = assign_namespaces(&ring, namespaces.iter().map(String::as_str));
    let listed = listed_by_shard(cp, RangeKey::Namespace, &assignment, &namespaces).await;
    assert_eq!(listed.len(), objects.len(), "every object listed");
    for ns in &namespaces {
        let owner = owner(&assignment, RangeKey::Namespace, "", ns);
        for ((object_ns, name), shards) in &listed {
            if object_ns == ns {
                assert_eq!(shards, &vec![owner.clone()], "{ns}/{name}");
            }
        }
    }
}

#[tokio::test]
async fn without_the_gate_the_probe_says_selectors_are_not_applied() {
    let cp = ControlPlane::dedicated(Options {
        without_sharded_list_and_watch: true,
        ..Options::default()
    })
    .await
    .expect("control plane");
    let client = cp.client().await.expect("client");
    let resource = ApiResource::erase::<ConfigMap>(&());
    assert!(!applies_selectors(&client, &resource).await.expect("probe"));
}
