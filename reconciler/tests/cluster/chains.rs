//! Chains on a real hierarchy: the control plane's deployment and replicaset controllers make
//! real ReplicaSets and Pods (Pending: no node runs them) for a ring of Deployments controlling
//! ReplicaSets and Pods. Every ReplicaSet and Pod carries its Deployment's shard from CREATE; a
//! scale-out moves Deployments, then their ReplicaSets, then their Pods, each level after the
//! one above it; a rollout stays on its Deployment's shard; after a switch from the reference
//! (a Pod placed by its ReplicaSet's key) each Pod off its ReplicaSet's shard moves once.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use sharder_common::{ClusterRingSpec, GroupResource, Ring, RingResource};
use sharder_harness::control_plane::{ADMIN_USER, audited_write};
use sharder_harness::fixtures::{pause_pod_spec, ring_object, secrets_ring};
use sharder_harness::wait::eventually;

use crate::{RECONCILER_ACCOUNT, Test, WAIT};

/// Deployments in the test, two Pods each.
const DEPLOYMENTS: usize = 8;

fn deployment(name: &str) -> Deployment {
    let labels: BTreeMap<String, String> = [("app".to_owned(), name.to_owned())].into();
    Deployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pause_pod_spec()),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The hierarchy as it stands: Deployments, ReplicaSets and Pods of the test namespace.
struct Hierarchy {
    deployments: BTreeMap<String, Deployment>,
    replicasets: BTreeMap<String, ReplicaSet>,
    pods: BTreeMap<String, Pod>,
}

impl Test {
    async fn hierarchy(&self) -> Hierarchy {
        async fn all<K>(api: Api<K>) -> BTreeMap<String, K>
        where
            K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        {
            let list = api.list(&ListParams::default()).await.expect("list");
            let named = list.items.into_iter().map(|o| (o.name_any(), o));
            named.filter(|(name, _)| name.starts_with("app-")).collect()
        }
        Hierarchy {
            deployments: all(Api::namespaced(self.client.clone(), &self.ns)).await,
            replicasets: all(Api::namespaced(self.client.clone(), &self.ns)).await,
            pods: all(Api::namespaced(self.client.clone(), &self.ns)).await,
        }
    }

    /// Whether every Deployment is on the shard `ring` picks for its key and not draining, and
    /// every ReplicaSet and Pod (`pods` of them at least) is on its controller's shard; else
    /// which are not.
    async fn chains_settled(&self, ring: &Ring, pods: usize) -> Result<Hierarchy, String> {
        let h = self.hierarchy().await;
        let mut wrong = Vec::new();
        for (name, d) in &h.deployments {
            let key = format!("apps/Deployment/{}/{name}", self.ns);
            if self.shard_of(d).as_deref() != ring.shard_for(&key) || self.draining(d) {
                wrong.push(format!("deployment {name} on {:?}", self.shard_of(d)));
            }
        }
        self.with_owners("replicaset", &h.replicasets, &h.deployments, &mut wrong);
        self.with_owners("pod", &h.pods, &h.replicasets, &mut wrong);
        if h.pods.len() < pods {
            wrong.push(format!("{} pods so far", h.pods.len()));
        }
        if wrong.is_empty() {
            Ok(h)
        } else {
            Err(format!("{} not settled: {wrong:?}", wrong.len()))
        }
    }

    /// Adds to `wrong` each of `objects` (of `kind`) not on the shard of its controller among
    /// `owners`.
    fn with_owners<K: Resource, O: Resource>(
        &self,
        kind: &str,
        objects: &BTreeMap<String, K>,
        owners: &BTreeMap<String, O>,
        wrong: &mut Vec<String>,
    ) {
        for (name, object) in objects {
            let owner = controller_name(object).and_then(|o| owners.get(&o));
            let want = owner.and_then(|o| self.shard_of(o));
            if want.is_none() || self.shard_of(object) != want {
                let on = self.shard_of(object);
                wrong.push(format!("{kind} {name} on {on:?}, its owner on {want:?}"));
            }
        }
    }

    /// Acknowledges every drained Deployment like its shard does (removes both labels with an
    /// optimistic lock; the webhook assigns it at that write).
    async fn acknowledge_deployments(&self) {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        for (name, d) in self.hierarchy().await.deployments {
            if self.draining(&d) {
                let patch = json!({"metadata": {
                    "resourceVersion": d.resource_version(),
                    "labels": {self.labels.shard.as_str(): null, self.labels.drain.as_str(): null},
                }});
                let _ = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
        }
    }
}

fn controller_name<K: Resource>(object: &K) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.name.clone())
}

/// A test whose ring shards Deployments with the ReplicaSets and Pods they control, with
/// Leases of `shard-a` and `shard-b` held for an hour; nothing started yet.
async fn chain_ring(prefix: &str) -> Test {
    let w = Test::new(prefix).await;
    // Pods need their namespace's default ServiceAccount (no controller here makes it).
    Api::<ServiceAccount>::namespaced(w.client.clone(), &w.ns)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("default".into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .expect("default ServiceAccount");
    let mut ring = secrets_ring(&w.ring, Some(&w.ns));
    ring.spec = ClusterRingSpec {
        resources: vec![RingResource {
            group: "apps".into(),
            resource: "deployments".into(),
            controlled_resources: vec![
                GroupResource::new("apps", "replicasets"),
                GroupResource::new("", "pods"),
            ],
        }],
        namespace_selector: ring.spec.namespace_selector.clone(),
    };
    w.rings()
        .create(&PostParams::default(), &ring_object(&w.id(), &ring))
        .await
        .expect("ring");
    for shard in ["shard-a", "shard-b"] {
        w.add_shard_lease(shard, 3600).await;
    }
    w
}

#[tokio::test]
async fn a_deployments_replicasets_and_pods_are_placed_and_moved_with_it_level_by_level() {
    let mut w = chain_ring("chains").await;
    w.start_webhook().await;
    w.start_reconciler().await;
    w.wait_until_admission_sees_configurations().await;
    let deployments: Api<Deployment> = Api::namespaced(w.client.clone(), &w.ns);
    let mut probe = 0;
    eventually("the webhook assigns new Deployments", WAIT, || {
        probe += 1;
        let (name, deployments, w) = (format!("probe-{probe}"), &deployments, &w);
        async move {
            let mut template = deployment(&name);
            template.spec.as_mut().expect("spec").replicas = Some(0);
            let created = deployments
                .create(&PostParams::default(), &template)
                .await
                .map_err(|e| e.to_string())?;
            let _ = deployments.delete(&name, &Default::default()).await;
            w.shard_of(&created)
                .ok_or_else(|| "not labelled".to_owned())
        }
    })
    .await;
    let two = Ring::new(["shard-a", "shard-b"]);
    let reconciler = w.service_account(RECONCILER_ACCOUNT);

    // Placed from CREATE: each ReplicaSet and Pod on its Deployment's shard, none written by
    // the reconciler.
    // Half of the Deployments move when shard-c joins, half stay.
    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let key = |name: &str| format!("apps/Deployment/{}/{name}", w.ns);
    let moves = |name: &String| two.shard_for(&key(name)) != three.shard_for(&key(name));
    let candidates: Vec<String> = (0..1000).map(|i| format!("app-{i}")).collect();
    let names = candidates.iter().filter(|n| moves(n)).take(DEPLOYMENTS / 2);
    let names = names.chain(
        candidates
            .iter()
            .filter(|n| !moves(n))
            .take(DEPLOYMENTS / 2),
    );
    let mark = w.audit_mark();
    for name in names {
        deployments
            .create(&PostParams::default(), &deployment(name))
            .await
            .expect("deployment");
    }
    eventually("each level on its Deployment's shard", WAIT, || {
        w.chains_settled(&two, 2 * DEPLOYMENTS)
    })
    .await;
    let written: Vec<(String, String)> =
        w.cp.audited_writes_since(mark)
            .iter()
            .filter_map(|e| audited_write(e, &w.ns, &reconciler))
            .filter(|(resource, _)| *resource != "deployments")
            .map(|(r, n)| (r.to_owned(), n.to_owned()))
            .collect();
    assert_eq!(
        written,
        Vec::new(),
        "the reconciler placed children the webhook should have"
    );

    // Scale-out: the moving Deployments drain and are acknowledged; then their ReplicaSets move,
    // then their Pods, each after the level above it.
    let mark = w.audit_mark();
    w.add_shard_lease("shard-c", 3600).await;
    let settled = eventually(
        "every level with its Deployment on three shards",
        WAIT,
        || async {
            w.acknowledge_deployments().await;
            w.chains_settled(&three, 2 * DEPLOYMENTS).await
        },
    )
    .await;
    // When the apiserver received each write to (resource, name) of the namespace, the last
    // one: a write caused by another is received after that one was (RFC 3339, microseconds:
    // ordered as strings); the audit log's own order is that of the answers.
    let mut moved: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut acknowledged: BTreeMap<String, String> = BTreeMap::new();
    for event in w.cp.audited_writes_since(mark) {
        let received = event["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some((resource, name)) = audited_write(&event, &w.ns, &reconciler) {
            moved.insert((resource.to_owned(), name.to_owned()), received);
        } else if let Some(("deployments", name)) = audited_write(&event, &w.ns, ADMIN_USER)
            && event["verb"] == "patch"
            && event["objectRef"]["subresource"].is_null()
        {
            // The test's acknowledgement (kube-controller-manager writes as the admin too, but
            // updates).
            acknowledged.insert(name.to_owned(), received);
        }
    }
    let moved_of = |resource: &str, name: &str| moved.get(&(resource.to_owned(), name.to_owned()));
    let mut levels = [0, 0];
    for (name, rs) in &settled.replicasets {
        let owner = controller_name(rs).expect("controlled");
        let before = two.shard_for(&format!("apps/Deployment/{}/{owner}", w.ns));
        let after = three.shard_for(&format!("apps/Deployment/{}/{owner}", w.ns));
        match moved_of("replicasets", name) {
            Some(at) => {
                assert_ne!(
                    before, after,
                    "replicaset {name} moved with a Deployment that stayed"
                );
                let acked = acknowledged
                    .get(&owner)
                    .expect("its Deployment acknowledged");
                assert!(
                    at > acked,
                    "replicaset {name} moved at {at}, before its Deployment at {acked}"
                );
                levels[0] += 1;
            }
            None => assert_eq!(before, after, "replicaset {name} left behind"),
        }
    }
    for (name, pod) in &settled.pods {
        let owner = controller_name(pod).expect("controlled");
        match (moved_of("pods", name), moved_of("replicasets", &owner)) {
            (Some(at), Some(owner_at)) => {
                assert!(
                    at > owner_at,
                    "pod {name} moved at {at}, before its ReplicaSet at {owner_at}"
                );
                levels[1] += 1;
            }
            (Some(_), None) => panic!("pod {name} moved without its ReplicaSet"),
            (None, Some(_)) => panic!("pod {name} left behind by its ReplicaSet"),
            (None, None) => {}
        }
    }
    assert_eq!(
        levels,
        [DEPLOYMENTS / 2, DEPLOYMENTS],
        "ReplicaSets and Pods moved with the moving half"
    );

    // A rollout: the new ReplicaSet and its Pods are placed on the Deployment's shard at CREATE.
    let mark = w.audit_mark();
    let rolled = settled
        .deployments
        .keys()
        .next()
        .expect("a Deployment")
        .clone();
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}});
    deployments
        .patch(&rolled, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("rollout");
    eventually(
        "the rollout's ReplicaSet and Pods with their Deployment",
        WAIT,
        || async {
            let h = w.chains_settled(&three, 2 * DEPLOYMENTS).await?;
            let of_app = h
                .replicasets
                .values()
                .filter(|r| controller_name(*r).as_ref() == Some(&rolled));
            (of_app.count() >= 2)
                .then_some(())
                .ok_or("no new ReplicaSet yet".to_owned())
        },
    )
    .await;
    let written =
        w.cp.audited_writes_since(mark)
            .iter()
            .filter(|e| audited_write(e, &w.ns, &reconciler).is_some())
            .count();
    assert_eq!(written, 0, "the reconciler moved parts of a rollout");
}

/// Switching from the reference, which places a Pod by its ReplicaSet's key: each Pod it put on
/// another shard than its ReplicaSet moves there, 1 write, and nothing else is written.
#[tokio::test]
async fn after_a_switch_from_the_reference_each_pod_off_its_replicasets_shard_moves_once() {
    const SWITCHED: usize = 12;
    let mut w = chain_ring("chainswitch").await;
    let deployments: Api<Deployment> = Api::namespaced(w.client.clone(), &w.ns);
    for i in 0..SWITCHED {
        let mut one = deployment(&format!("app-{i}"));
        one.spec.as_mut().expect("spec").replicas = Some(1);
        deployments
            .create(&PostParams::default(), &one)
            .await
            .expect("deployment");
    }
    let h = eventually("every Deployment's Pod", WAIT, || async {
        let h = w.hierarchy().await;
        (h.pods.len() == SWITCHED && h.replicasets.len() == SWITCHED)
            .then_some(h)
            .ok_or("not yet".to_owned())
    })
    .await;
    // Placed as the reference places them: each object by its controller's key (a
    // Deployment by its own).
    let two = Ring::new(["shard-a", "shard-b"]);
    let key = |kind: &str, name: &str| format!("apps/{kind}/{}/{name}", w.ns);
    let label = |shard: Option<&str>| json!({"metadata": {"labels": {w.labels.shard.as_str(): shard.expect("a shard")}}});
    let params = PatchParams::default();
    let mut misplaced = Vec::new();
    for name in h.deployments.keys() {
        let patch = label(two.shard_for(&key("Deployment", name)));
        deployments
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .expect("label");
    }
    let replicasets: Api<ReplicaSet> = Api::namespaced(w.client.clone(), &w.ns);
    for (name, rs) in &h.replicasets {
        let owner = controller_name(rs).expect("controlled");
        let patch = label(two.shard_for(&key("Deployment", &owner)));
        replicasets
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .expect("label");
    }
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.ns);
    for (name, pod) in &h.pods {
        let owner = controller_name(pod).expect("controlled");
        let shard = two.shard_for(&key("ReplicaSet", &owner));
        let deployment = h.replicasets[&owner].owner_references()[0].name.clone();
        if shard != two.shard_for(&key("Deployment", &deployment)) {
            misplaced.push(("pods".to_owned(), name.clone()));
        }
        pods.patch(name, &params, &Patch::Merge(&label(shard)))
            .await
            .expect("label");
    }
    assert!(
        !misplaced.is_empty(),
        "the reference put every Pod with its ReplicaSet"
    );

    let mark = w.audit_mark();
    w.start_reconciler().await;
    eventually("every Pod with its ReplicaSet", WAIT, || {
        w.chains_settled(&two, SWITCHED)
    })
    .await;
    let reconciler = w.service_account(RECONCILER_ACCOUNT);
    let mut written: Vec<(String, String)> =
        w.cp.audited_writes_since(mark)
            .iter()
            .filter_map(|e| audited_write(e, &w.ns, &reconciler))
            .map(|(r, n)| (r.to_owned(), n.to_owned()))
            .collect();
    written.sort();
    misplaced.sort();
    assert_eq!(written, misplaced, "one write per misplaced Pod, none else");
}
