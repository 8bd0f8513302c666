//! Rings keyed by namespace (annotation `sharder.dev/key: namespace`): every object of a
//! namespace, main or controlled, owned or not, carries the namespace's shard from CREATE; a
//! scale-out moves whole namespaces (main objects drained and acknowledged first, each level of
//! their hierarchies after the level above it); a shard's death moves its namespaces whole; a
//! bad value makes the ring invalid, reported, and nothing is assigned or moved. With the
//! placement policy (Kubernetes 1.36 or later) a namespace's objects are labelled inside the
//! apiserver, the webhook not asked, and a scale-out with the webhook down takes the moving
//! namespaces out of the table first and puts them back on their new shard; where the apiserver
//! serves no policies, the webhook alone assigns.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sharder_common::key::KEY_ANNOTATION;
use sharder_common::placement_policy::{Table, binding_resource, policy_resource};
use sharder_common::{Ring, RingObject};
use sharder_harness::control_plane::{ADMIN_USER, AuditMark, ControlPlane, Options, audited_write};
use sharder_harness::fixtures::{ring_object, secrets_ring};
use sharder_harness::wait::{eventually, metric_sum};
use sharder_harness::world::set_lease_holder;

use crate::{RECONCILER_ACCOUNT, Test, WAIT, named, wait_until_policy_deleted};

/// The label selecting the test's namespaces for its ring.
const SELECTED: &str = "namespace-key-test";

/// Each namespace's objects: Secrets (main), ConfigMaps controlled by the first Secret, one
/// ConfigMap controlled by the first of those (a level of a chain), and one without an owner.
const SECRETS: [&str; 3] = ["s-0", "s-1", "s-2"];
const CHILDREN: [&str; 2] = ["c-0", "c-1"];
const GRANDCHILD: &str = "g-0";
const LOOSE: &str = "loose";

fn key(namespace: &str) -> String {
    format!("/Namespace//{namespace}")
}

/// `n` namespaces `<prefix>-t<i>` that the ring of shard-a and shard-b puts on `from` and the
/// ring with shard-c too on `to`.
fn pick(prefix: &str, from: &str, to: &str, n: usize) -> Vec<String> {
    let two = Ring::new(["shard-a", "shard-b"]);
    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    (0..)
        .map(|i| format!("{prefix}-t{i}"))
        .filter(|ns| two.shard_for(&key(ns)) == Some(from) && three.shard_for(&key(ns)) == Some(to))
        .take(n)
        .collect()
}

impl Test {
    /// Each of `namespaces` whose Secrets and ConfigMaps are not all on the shard `ring` picks
    /// for the namespace (or are draining), with what is off.
    async fn namespaces_off(&self, namespaces: &[String], ring: &Ring) -> Result<(), String> {
        let mut off = Vec::new();
        for ns in namespaces {
            let want = ring.shard_for(&key(ns));
            let secrets = Api::<Secret>::namespaced(self.client.clone(), ns);
            let configmaps = Api::<ConfigMap>::namespaced(self.client.clone(), ns);
            let lp = ListParams::default();
            let secrets = secrets.list(&lp).await.map_err(|e| e.to_string())?;
            let configmaps = configmaps.list(&lp).await.map_err(|e| e.to_string())?;
            let objects = secrets
                .items
                .iter()
                .map(|s| (s.name_any(), self.shard_of(s), self.draining(s)))
                .chain(
                    configmaps
                        .items
                        .iter()
                        .map(|c| (c.name_any(), self.shard_of(c), self.draining(c))),
                );
            let mut count = 0;
            for (name, shard, draining) in objects {
                count += 1;
                if shard.as_deref() != want || draining {
                    off.push(format!(
                        "{ns}/{name} on {shard:?} (draining: {draining}), want {want:?}"
                    ));
                }
            }
            if count < SECRETS.len() + CHILDREN.len() + 2 {
                off.push(format!("{ns}: {count} objects so far"));
            }
        }
        if off.is_empty() {
            Ok(())
        } else {
            Err(format!("{} off: {off:?}", off.len()))
        }
    }

    /// The objects of `namespaces` that `user` wrote since `mark` (`<namespace> <resource>/<name>`).
    fn writes_in(&self, namespaces: &[String], user: &str, mark: AuditMark) -> Vec<String> {
        let events = self.cp.audited_writes_since(mark);
        let written = events.iter().filter_map(|e| {
            namespaces
                .iter()
                .find_map(|ns| audited_write(e, ns, user).map(|(r, n)| format!("{ns} {r}/{n}")))
        });
        written.collect()
    }

    /// Creates `namespaces` (selected by the test's label), a ring keyed by namespace over
    /// them, Leases of shard-a and shard-b held for an hour, the webhook and a reconciler; once
    /// admission sees the webhook configuration.
    async fn start_namespace_ring(&mut self, namespaces: &[String]) {
        let api = Api::<Namespace>::all(self.client.clone());
        for ns in namespaces {
            let mut namespace: Namespace = named(ns, &[]);
            namespace.metadata.labels = Some([(SELECTED.to_owned(), self.ns.clone())].into());
            api.create(&PostParams::default(), &namespace)
                .await
                .expect("namespace");
        }
        let mut ring = secrets_ring(&self.ring, Some(&self.ns));
        ring.spec.namespace_selector = Some(LabelSelector {
            match_labels: Some([(SELECTED.to_owned(), self.ns.clone())].into()),
            match_expressions: None,
        });
        let mut object = ring_object(&self.id(), &ring);
        object.metadata.annotations =
            Some([(KEY_ANNOTATION.to_owned(), "namespace".to_owned())].into());
        self.rings()
            .create(&PostParams::default(), &object)
            .await
            .expect("ring");
        for shard in ["shard-a", "shard-b"] {
            self.add_shard_lease(shard, 3600).await;
        }
        self.start_webhook().await;
        self.start_reconciler().await;
        self.wait_until_admission_sees_configurations().await;
    }

    /// Creates in each of `namespaces` the Secrets, their children, a grandchild and a loose
    /// ConfigMap.
    async fn create_hierarchies(&self, namespaces: &[String]) {
        for ns in namespaces {
            let secrets = Api::<Secret>::namespaced(self.client.clone(), ns);
            let configmaps = Api::<ConfigMap>::namespaced(self.client.clone(), ns);
            let mut owner = None;
            for name in SECRETS {
                let created = secrets
                    .create(&PostParams::default(), &named(name, &[]))
                    .await
                    .expect("secret");
                owner.get_or_insert(created);
            }
            let controlled_by = |kind: &str, owner: &ObjectMeta| {
                Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: kind.into(),
                    name: owner.name.clone().expect("name"),
                    uid: owner.uid.clone().expect("uid"),
                    controller: Some(true),
                    block_owner_deletion: None,
                }])
            };
            let owner = owner.expect("an owner");
            let mut first = None;
            for name in CHILDREN {
                let mut child: ConfigMap = named(name, &[]);
                child.metadata.owner_references = controlled_by("Secret", &owner.metadata);
                let created = configmaps
                    .create(&PostParams::default(), &child)
                    .await
                    .expect("child");
                first.get_or_insert(created);
            }
            let mut grandchild: ConfigMap = named(GRANDCHILD, &[]);
            grandchild.metadata.owner_references =
                controlled_by("ConfigMap", &first.expect("a child").metadata);
            configmaps
                .create(&PostParams::default(), &grandchild)
                .await
                .expect("grandchild");
            configmaps
                .create(&PostParams::default(), &named(LOOSE, &[]))
                .await
                .expect("loose configmap");
        }
    }

    /// Waits until new Secrets in `namespace` are assigned at CREATE (probes, deleted again).
    async fn wait_until_assigned_in(&self, namespace: &str) {
        let probes = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let mut probe = 0;
        eventually("new Secrets are assigned", WAIT, || {
            probe += 1;
            let (name, probes) = (format!("probe-{probe}"), &probes);
            async move {
                let created = probes
                    .create(&PostParams::default(), &named(&name, &[]))
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = probes.delete(&name, &Default::default()).await;
                self.shard_of(&created)
                    .ok_or_else(|| "not labelled".to_owned())
            }
        })
        .await;
    }

    /// Adds shard-c and waits until each of `namespaces` is on its shard of the three,
    /// acknowledging the drains of the `moving` ones as their shards do; where the audit log
    /// stood before.
    async fn scale_out_to_c(&self, namespaces: &[String], moving: &[String]) -> AuditMark {
        let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
        let mark = self.audit_mark();
        self.add_shard_lease("shard-c", 3600).await;
        eventually("each namespace on its shard of three", WAIT, || async {
            self.acknowledge_in(moving).await;
            self.namespaces_off(namespaces, &three).await
        })
        .await;
        mark
    }

    /// Acknowledges every drained Secret of `namespaces` as its shard does.
    async fn acknowledge_in(&self, namespaces: &[String]) {
        for ns in namespaces {
            let api = Api::<Secret>::namespaced(self.client.clone(), ns);
            let Ok(list) = api.list(&ListParams::default()).await else {
                continue;
            };
            for secret in list.items.iter().filter(|s| self.draining(*s)) {
                let patch = json!({"metadata": {
                    "resourceVersion": secret.resource_version(),
                    "labels": {self.labels.shard.as_str(): null, self.labels.drain.as_str(): null},
                }});
                let _ = api
                    .patch(
                        &secret.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
            }
        }
    }
}

#[tokio::test]
async fn a_ring_keyed_by_namespace_places_and_moves_whole_namespaces() {
    let mut w = Test::new("nskey").await;
    // Six namespaces: two that move to shard-c when it joins, two that stay on shard-a and two
    // on shard-b (which moves them when shard-b dies).
    let two = Ring::new(["shard-a", "shard-b"]);
    let survivors = Ring::new(["shard-a", "shard-c"]);
    let pick = |from, to| pick(&w.ns, from, to, 2);
    let moving: Vec<String> = [pick("shard-a", "shard-c"), pick("shard-b", "shard-c")].concat();
    let moving = moving[..2].to_vec();
    let namespaces: Vec<String> = [
        moving.clone(),
        pick("shard-a", "shard-a"),
        pick("shard-b", "shard-b"),
    ]
    .concat();
    assert_eq!(namespaces.len(), 6, "candidates of every kind");
    w.start_namespace_ring(&namespaces).await;
    w.wait_until_assigned_in(&namespaces[0]).await;
    let mut probe = 0;
    let reconciler = w.service_account(RECONCILER_ACCOUNT);

    // Placed from CREATE, by admission alone (the webhook, or the placement policy once the
    // namespaces are in its table): each namespace's objects on its shard.
    let mark = w.audit_mark();
    w.create_hierarchies(&namespaces).await;
    eventually("each namespace on its shard", WAIT, || {
        w.namespaces_off(&namespaces, &two)
    })
    .await;
    let written = w.writes_in(&namespaces, &reconciler, mark);
    assert_eq!(
        written,
        Vec::<String>::new(),
        "the reconciler placed what the webhook should have"
    );

    // Scale-out: the moving namespaces' Secrets drain and are acknowledged, then their
    // ConfigMaps follow; nothing of the other namespaces is written.
    let mark = w.scale_out_to_c(&namespaces, &moving).await;
    let mut moved: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut acknowledged: BTreeMap<(String, String), String> = BTreeMap::new();
    for event in w.cp.audited_writes_since(mark) {
        let received = event["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for ns in &namespaces {
            if let Some((resource, name)) = audited_write(&event, ns, &reconciler) {
                moved
                    .entry((ns.clone(), format!("{resource}/{name}")))
                    .or_default()
                    .push(received.clone());
            } else if let Some(("secrets", name)) = audited_write(&event, ns, ADMIN_USER)
                && event["verb"] == "patch"
            {
                acknowledged.insert((ns.clone(), name.to_owned()), received.clone());
            }
        }
    }
    let mut expected: Vec<(String, String)> = Vec::new();
    for ns in &moving {
        for name in SECRETS {
            expected.push((ns.clone(), format!("secrets/{name}")));
        }
        for name in CHILDREN.into_iter().chain([GRANDCHILD, LOOSE]) {
            expected.push((ns.clone(), format!("configmaps/{name}")));
        }
    }
    expected.sort();
    assert_eq!(
        moved.keys().cloned().collect::<Vec<_>>(),
        expected,
        "exactly the moving namespaces' objects were written"
    );
    for ((ns, object), at) in &moved {
        // A Secret is drained again if the webhook had not seen shard-c at its acknowledgement;
        // a ConfigMap is written once.
        let Some(child) = object.strip_prefix("configmaps/") else {
            continue;
        };
        assert_eq!(at.len(), 1, "{ns} {object} written once: {at:?}");
        // Each after the level above it: a child after its Secret's acknowledgement, the
        // grandchild after its ConfigMap's move.
        let above = match child {
            LOOSE => continue,
            GRANDCHILD => &moved[&(ns.clone(), format!("configmaps/{}", CHILDREN[0]))][0],
            _ => &acknowledged[&(ns.clone(), SECRETS[0].to_owned())],
        };
        assert!(
            at[0] > *above,
            "{ns} {child} moved at {}, before the level above it at {above}",
            at[0]
        );
    }

    // Shard-b dies (its Lease released): its namespaces move whole, directly.
    set_lease_holder(&w.leases(), "shard-b", "").await;
    eventually("each namespace on a surviving shard", WAIT, || {
        w.namespaces_off(&namespaces, &survivors)
    })
    .await;

    // A value the ring does not know: invalid, reported, nothing assigned or moved.
    let patch = json!({"metadata": {"annotations": {KEY_ANNOTATION: "name"}}});
    w.rings()
        .patch(&w.ring, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    let message = eventually("the ring reports the bad value", WAIT, || async {
        let ready = w.ring_condition("Ready").await?;
        (ready["status"] == "False" && ready["reason"] == "InvalidSpec")
            .then(|| ready["message"].as_str().unwrap_or_default().to_owned())
            .ok_or(ready.to_string())
    })
    .await;
    assert!(message.contains("sharder.dev/key: \"name\""), "{message}");
    eventually("a Warning Event names it", WAIT, || async {
        w.ring_event("Warning", "InvalidSpec")
            .await
            .then_some(())
            .ok_or("no Event")
    })
    .await;
    let mark = w.audit_mark();
    w.add_shard_lease("shard-d", 3600).await;
    eventually("the invalid ring counts the new shard", WAIT, || async {
        let ring = w
            .rings()
            .get_status(&w.ring)
            .await
            .map_err(|e| e.to_string())?;
        (ring.data["status"]["availableShards"] == 3)
            .then_some(())
            .ok_or(ring.data["status"].to_string())
    })
    .await;
    let late = Api::<Secret>::namespaced(w.client.clone(), &namespaces[0]);
    eventually("the webhook leaves new objects unassigned", WAIT, || {
        probe += 1;
        let (name, late, w) = (format!("late-{probe}"), &late, &w);
        async move {
            let created = late
                .create(&PostParams::default(), &named(&name, &[]))
                .await
                .map_err(|e| e.to_string())?;
            match w.shard_of(&created) {
                None => Ok(()),
                Some(shard) => {
                    let _ = late.delete(&name, &Default::default()).await;
                    Err(format!("assigned to {shard}"))
                }
            }
        }
    })
    .await;
    let written = w.writes_in(&namespaces, &reconciler, mark);
    assert_eq!(
        written,
        Vec::<String>::new(),
        "an invalid ring moves nothing"
    );
    w.namespaces_off(&namespaces[1..], &survivors)
        .await
        .expect("every namespace where it was");
}

#[tokio::test]
async fn a_namespace_ring_is_assigned_inside_the_apiserver_and_moves_with_the_webhook_down() {
    let mut w = Test::new("nspolicy").await;
    let three = Ring::new(["shard-a", "shard-b", "shard-c"]);
    let two = Ring::new(["shard-a", "shard-b"]);
    let moving = [
        pick(&w.ns, "shard-a", "shard-c", 1),
        pick(&w.ns, "shard-b", "shard-c", 1),
    ]
    .concat();
    let namespaces: Vec<String> = [
        moving.clone(),
        pick(&w.ns, "shard-a", "shard-a", 1),
        pick(&w.ns, "shard-b", "shard-b", 1),
    ]
    .concat();
    w.start_namespace_ring(&namespaces).await;
    let reconciler = w.service_account(RECONCILER_ACCOUNT);
    let ring = RingObject::from_dynamic(w.kind, &w.rings().get(&w.ring).await.expect("ring"));
    let table = Table::of(&ring, &w.ns);
    let tables = Api::<ConfigMap>::namespaced(w.client.clone(), &w.ns);
    let on = |ring: &Ring, of: &[String]| -> BTreeMap<String, String> {
        of.iter()
            .map(|ns| {
                (
                    ns.clone(),
                    ring.shard_for(&key(ns)).expect("a shard").to_owned(),
                )
            })
            .collect()
    };
    let table_is = |want: BTreeMap<String, String>| {
        let (tables, name) = (&tables, &table.name);
        async move {
            let data = tables
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|t| t.data)
                .unwrap_or_default();
            (data == want)
                .then_some(())
                .ok_or(format!("{data:?}, want {want:?}"))
        }
    };
    eventually("the table names each namespace's shard", WAIT, || {
        table_is(on(&two, &namespaces))
    })
    .await;

    // The policy labels new objects before the webhook is asked (its object selector then
    // skips them): a new object is labelled and the webhook answered no review for it.
    let reviews = || async {
        let metrics = w.webhook.as_ref().expect("the webhook").metrics().await;
        metric_sum(
            &metrics,
            "sharder_webhook_request_duration_seconds_count",
            &[],
        )
    };
    let probes = Api::<Secret>::namespaced(w.client.clone(), &namespaces[0]);
    let mut probe = 0;
    eventually(
        "the policy labels a new object, not the webhook",
        WAIT,
        || {
            probe += 1;
            let (name, probes, w, reviews) = (format!("probe-{probe}"), &probes, &w, &reviews);
            async move {
                let before = reviews().await;
                let created = probes
                    .create(&PostParams::default(), &named(&name, &[]))
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = probes.delete(&name, &Default::default()).await;
                let asked = reviews().await - before;
                match w.shard_of(&created) {
                    Some(_) if asked == 0.0 => Ok(()),
                    shard => Err(format!("on {shard:?}, {asked} reviews")),
                }
            }
        },
    )
    .await;
    let (before, mark) = (reviews().await, w.audit_mark());
    w.create_hierarchies(&namespaces).await;
    w.namespaces_off(&namespaces, &two)
        .await
        .expect("every object on its namespace's shard from CREATE");
    assert_eq!(reviews().await, before, "the webhook was asked");
    assert_eq!(
        w.writes_in(&namespaces, &reconciler, mark),
        Vec::<String>::new()
    );

    // With the webhook down, shard-c joins: the moving namespaces leave the table before their
    // objects drain; what they acknowledge and create meanwhile is assigned by the reconciler;
    // once all moved, the table names their new shard and the policy assigns there.
    w.stop_webhook();
    let mark = w.scale_out_to_c(&namespaces, &moving).await;
    eventually("the table names each namespace's new shard", WAIT, || {
        table_is(on(&three, &namespaces))
    })
    .await;
    let events = w.cp.audited_writes_since(mark);
    let at = |event: &serde_json::Value| {
        event["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let table_writes: Vec<String> = events
        .iter()
        .filter(|e| audited_write(e, &w.ns, &reconciler) == Some(("configmaps", &table.name)))
        .map(at)
        .collect();
    let first_drain = events
        .iter()
        .filter(|e| {
            moving
                .iter()
                .any(|ns| audited_write(e, ns, &reconciler).is_some())
        })
        .map(at)
        .min()
        .expect("the moving namespaces' objects were written");
    assert!(
        table_writes.first().is_some_and(|left| *left < first_drain),
        "the moving namespaces left the table ({table_writes:?}) before the first move ({first_drain})"
    );
    let late = Api::<Secret>::namespaced(w.client.clone(), &moving[0]);
    let created = late
        .create(&PostParams::default(), &named("late", &[]))
        .await
        .expect("a Secret with the webhook down");
    assert_eq!(w.shard_of(&created).as_deref(), Some("shard-c"));

    // Turned off, the policy goes (its binding with it): new objects wait for the webhook.
    w.reconcilers[0].process.stop(Duration::from_secs(20));
    w.start_reconciler_with(Duration::from_secs(1), &[("--placement-policy", "off")])
        .await;
    let name = w.id().configuration_name();
    let policies = Api::<DynamicObject>::all_with(w.client.clone(), &policy_resource());
    let bindings = Api::<DynamicObject>::all_with(w.client.clone(), &binding_resource());
    wait_until_policy_deleted("the placement policy deleted", &policies, &bindings, &name).await;
}

#[tokio::test]
async fn where_the_apiserver_serves_no_placement_policy_the_webhook_alone_assigns_a_namespace_ring()
{
    let cp = ControlPlane::dedicated(Options {
        without_mutating_admission_policies: true,
        ..Options::default()
    })
    .await
    .expect("a control plane without MutatingAdmissionPolicies");
    let mut w = Test::on(cp, "nsnopolicy").await;
    let two = Ring::new(["shard-a", "shard-b"]);
    let namespaces = [
        pick(&w.ns, "shard-a", "shard-a", 1),
        pick(&w.ns, "shard-b", "shard-b", 1),
    ]
    .concat();
    w.start_namespace_ring(&namespaces).await;
    w.wait_until_assigned_in(&namespaces[0]).await;
    let mark = w.audit_mark();
    w.create_hierarchies(&namespaces).await;
    eventually("each namespace on its shard", WAIT, || {
        w.namespaces_off(&namespaces, &two)
    })
    .await;
    let reconciler = w.service_account(RECONCILER_ACCOUNT);
    assert_eq!(
        w.writes_in(&namespaces, &reconciler, mark),
        Vec::<String>::new(),
        "the webhook placed them"
    );
    // A sweep of the ring has run since (it would have written its table).
    w.wait_for_rebalances(0, 1).await;
    let ring = RingObject::from_dynamic(w.kind, &w.rings().get(&w.ring).await.expect("ring"));
    let table = Table::of(&ring, &w.ns);
    let tables = Api::<ConfigMap>::namespaced(w.client.clone(), &w.ns);
    assert!(
        tables.get_opt(&table.name).await.expect("read").is_none(),
        "no table where no policy reads it"
    );
}
