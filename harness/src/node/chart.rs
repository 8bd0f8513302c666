//! The chart and the example shards on the node, as users run them: `kubectl` and `helm
//! install` against the node's cluster, readiness of the chart's Deployments and the example's
//! StatefulSet, and the memory of the pods' containers as kubelet counts it (the working set
//! of their cgroups) beside the processes' own resident sets.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use super::Node;
use crate::control_plane::assets_dir;
use crate::helm::Helm;
use crate::supervisor::blocking;
use crate::{Error, procfs};

/// The release name of the chart, as the README installs it.
pub const RELEASE: &str = "sharder";
/// The namespace the chart is installed into, as the README installs it.
pub const RELEASE_NAMESPACE: &str = "sharding-system";
/// The namespace the example shards run in (the example's ClusterRoleBinding names it).
pub const SHARDS_NAMESPACE: &str = "my-namespace";
/// The example's StatefulSet (and the prefix of its shard names).
pub const STATEFULSET: &str = "checksum-controller";
/// The ControllerRing the example's shards join.
pub const RING: &str = "checksums";
/// The reconciler pod of the chart holding the leader election Lease (its identity starts
/// with its pod's host name), or why there is none.
pub async fn leader(client: &Client) -> Result<String, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .get(&format!("{RELEASE}-reconciler"))
        .await
        .map_err(|e| e.to_string())?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .ok_or("no holder")?;
    Api::<Pod>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|p| p.name_any())
        .find(|pod| holder == *pod || holder.starts_with(&format!("{pod}-")))
        .ok_or(format!("holder {holder} is no pod"))
}

/// The chart values of the README's install: one ControllerRing [`RING`] sharding Secrets and the
/// ConfigMaps they control, in every namespace but `kube-system` and the release's (the
/// default namespace selector).
pub fn ring_values() -> Value {
    json!({ "controllerRings": [{
        "name": RING,
        "resources": [{
            "group": "",
            "resource": "secrets",
            "controlledResources": [{ "group": "", "resource": "configmaps" }]
        }],
    }]})
}

/// `kubectl` (built beside the apiserver) against the node's cluster; each command and its
/// output are printed on stderr.
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// `kubectl` for `node`'s cluster.
    pub fn of(node: &Node) -> Result<Self, Error> {
        Ok(Self {
            bin: assets_dir()?.join("kubectl"),
            kubeconfig: node.control_plane().kubeconfig().to_path_buf(),
        })
    }

    /// Runs `kubectl args`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String, Error> {
        eprintln!("$ kubectl {}", args.join(" "));
        let mut kubectl = Command::new(&self.bin);
        kubectl.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        let output = blocking(|| kubectl.output()).map_err(Error::io("run kubectl"))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        eprint!("{stdout}");
        if output.status.success() {
            Ok(stdout)
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            eprint!("{stderr}");
            Err(Error::Command(format!(
                "kubectl {}: {stderr}",
                args.join(" ")
            )))
        }
    }
}

/// A workload whose readiness is waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// A Deployment (the chart's webhook and reconciler).
    Deployment,
    /// A StatefulSet (the example's shards).
    StatefulSet,
}

impl Workload {
    fn kubectl_name(self) -> &'static str {
        match self {
            Self::Deployment => "deployment",
            Self::StatefulSet => "statefulset",
        }
    }
}

/// Ready replicas and desired replicas of the workload `ns/name`.
pub async fn replicas(
    client: &Client,
    workload: Workload,
    name: &str,
    ns: &str,
) -> Result<(i32, i32), Error> {
    Ok(match workload {
        Workload::Deployment => {
            let d = Api::<Deployment>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(Error::Kube)?;
            (
                d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                d.spec.and_then(|s| s.replicas).unwrap_or(1),
            )
        }
        Workload::StatefulSet => {
            let s = Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(Error::Kube)?;
            (
                s.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                s.spec.and_then(|s| s.replicas).unwrap_or(1),
            )
        }
    })
}

impl Node {
    /// Waits until `want` replicas of the workload `ns/name` are ready (`None`: as many as it
    /// asks for); on timeout, the error carries what the cluster says of the namespace's pods
    /// and the tails of the node's logs.
    pub async fn wait_ready(
        &self,
        workload: Workload,
        name: &str,
        ns: &str,
        want: Option<i32>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let client = self.control_plane().client().await?;
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < timeout {
            match replicas(&client, workload, name, ns).await {
                Ok((ready, desired)) if ready == want.unwrap_or(desired) => return Ok(()),
                Ok((ready, desired)) => {
                    last = format!("{ready} of {} ready", want.unwrap_or(desired));
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut diagnostics = String::new();
        if let Ok(kubectl) = Kubectl::of(self) {
            for args in [
                &["get", "pods", "-A", "-o", "wide"][..],
                &["describe", "pods", "-n", ns],
            ] {
                diagnostics.push_str(&kubectl.run(args).unwrap_or_else(|e| e.to_string()));
            }
        }
        for log in ["kubelet.log", "containerd.log", "kube-proxy.log"] {
            diagnostics.push_str(&format!("--- {log}\n{}\n", self.log_tail(log, 40)));
        }
        Err(Error::NotReady(format!(
            "{} {ns}/{name}: {last} after {timeout:?}\n{diagnostics}",
            workload.kubectl_name()
        )))
    }

    /// `helm install` of the chart with `values` as the README installs it ([`RELEASE`] into
    /// [`RELEASE_NAMESPACE`], created first), then waits until the webhook's and the
    /// reconciler's pods are all Ready; how long that took from the install's start.
    pub async fn install_chart(
        &self,
        values: &Value,
        timeout: Duration,
    ) -> Result<Duration, Error> {
        let helm = Helm::get()?;
        let started = Instant::now();
        Kubectl::of(self)?.run(&["create", "namespace", RELEASE_NAMESPACE])?;
        let set: Vec<String> = values
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, value)| format!(" --set-json '{key}={value}'"))
            .collect();
        eprintln!(
            "$ helm install {RELEASE} charts/sharder -n {RELEASE_NAMESPACE}{}",
            set.concat()
        );
        helm.deploy(
            "install",
            values,
            RELEASE,
            RELEASE_NAMESPACE,
            self.control_plane().kubeconfig(),
        )
        .map_err(|e| Error::Command(format!("helm install: {e}")))?;
        for name in ["sharder-webhook", "sharder-reconciler"] {
            let left = timeout.saturating_sub(started.elapsed());
            self.wait_ready(Workload::Deployment, name, RELEASE_NAMESPACE, None, left)
                .await?;
        }
        Ok(started.elapsed())
    }

    /// Applies `docs/examples/statefulset-shards.yaml` in [`SHARDS_NAMESPACE`] (created first)
    /// with `replicas` shards and `extra_args` in the shard's arguments (see [`example_with`]).
    pub fn apply_example(&self, replicas: u32, extra_args: &[&str]) -> Result<(), Error> {
        Kubectl::of(self)?.run(&["create", "namespace", SHARDS_NAMESPACE])?;
        self.reapply_example(replicas, extra_args)
    }

    /// `kubectl apply` of the example as [`Node::apply_example`] writes it, in the namespace it
    /// made: a change of `extra_args` rolls the StatefulSet's pods one at a time.
    pub fn reapply_example(&self, replicas: u32, extra_args: &[&str]) -> Result<(), Error> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/examples/statefulset-shards.yaml");
        let example =
            std::fs::read_to_string(&path).map_err(Error::io("read the example shards"))?;
        let example = example_with(&example, replicas, extra_args).map_err(|missing| {
            Error::Command(format!(
                "{} no longer has `{missing}`: update harness/src/node/chart.rs",
                path.display()
            ))
        })?;
        let manifest = self.dir.join(format!("{STATEFULSET}.yaml"));
        std::fs::write(&manifest, example).map_err(Error::io("write the example shards"))?;
        let applied = Kubectl::of(self)?.run(&[
            "apply",
            "-n",
            SHARDS_NAMESPACE,
            "-f",
            &manifest.to_string_lossy(),
        ]);
        let _ = std::fs::remove_file(&manifest);
        applied.map(|_| ())
    }
}

/// The example's manifest with `replicas` shards and `extra_args` in the shard's arguments (its
/// only changes): an `--flag=value` replaces the example's own `--flag=...` line, anything else is
/// added after `--log-format=json`. The error is the line the manifest no longer has.
fn example_with(example: &str, replicas: u32, extra_args: &[&str]) -> Result<String, &'static str> {
    const ARG: &str = "            - ";
    const ANCHOR: &str = "            - --log-format=json\n";
    const REPLICAS: &str = "  replicas: 3\n";
    for line in [ANCHOR, REPLICAS] {
        if !example.contains(line) {
            return Err(line.trim());
        }
    }
    let mut example = example.replace(REPLICAS, &format!("  replicas: {replicas}\n"));
    let mut added = String::new();
    for arg in extra_args {
        let line = format!("{ARG}{arg}\n");
        let own = arg.split_once('=').and_then(|(flag, _)| {
            let start = example.find(&format!("{ARG}{flag}="))?;
            Some(start..start + example[start..].find('\n')? + 1)
        });
        match own {
            Some(range) => example.replace_range(range, &line),
            None => added.push_str(&line),
        }
    }
    Ok(example.replace(ANCHOR, &format!("{ANCHOR}{added}")))
}

impl Node {
    /// `kubectl scale` of the example's StatefulSet to `replicas` shards.
    pub fn scale_example(&self, replicas: u32) -> Result<(), Error> {
        Kubectl::of(self)?
            .run(&[
                "scale",
                "statefulset",
                STATEFULSET,
                "-n",
                SHARDS_NAMESPACE,
                &format!("--replicas={replicas}"),
            ])
            .map(|_| ())
    }
}

/// The memory of one running container, as its cgroup and its processes count it, in KiB.
#[derive(Clone, Debug)]
pub struct ContainerMemory {
    /// The pod.
    pub pod: String,
    /// The container.
    pub container: String,
    /// Working set: the cgroup's usage minus its inactive file pages (what kubelet reports and
    /// evicts by).
    pub working_set: u64,
    /// The cgroup's peak usage (page cache included), where the kernel keeps it.
    pub max_usage: Option<u64>,
    /// Resident set of the container's processes now (`VmRSS`, summed).
    pub rss: u64,
    /// The anonymous part of it (`RssAnon`): the rest are the binary's file pages, charged to
    /// whichever cgroup read them first (on this node: containerd's unpacking).
    pub rss_anon: u64,
    /// Peak resident set of the container's processes (`VmHWM`, summed).
    pub hwm: u64,
}

/// The memory cgroup folder of container `id` on this node (cgroup v1, else v2).
fn cgroup_dir(id: &str) -> Option<PathBuf> {
    ["/sys/fs/cgroup/memory/k8s.io", "/sys/fs/cgroup/k8s.io"]
        .iter()
        .map(|root| PathBuf::from(root).join(id))
        .find(|dir| dir.is_dir())
}

fn read_kib(dir: &std::path::Path, file: &str) -> Option<u64> {
    let bytes: u64 = std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(bytes / 1024)
}

/// The memory of container `id` from its cgroup (`None` if it has none on this machine).
fn container_memory(id: &str) -> Option<(u64, Option<u64>, [u64; 3])> {
    let dir = cgroup_dir(id)?;
    let (usage, inactive_key, max) = if dir.join("memory.usage_in_bytes").is_file() {
        (
            read_kib(&dir, "memory.usage_in_bytes")?,
            "total_inactive_file ",
            read_kib(&dir, "memory.max_usage_in_bytes"),
        )
    } else {
        (
            read_kib(&dir, "memory.current")?,
            "inactive_file ",
            read_kib(&dir, "memory.peak"),
        )
    };
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(inactive_key))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
        / 1024;
    let mut process = [0; 3];
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse().ok()) {
        for (sum, field) in process.iter_mut().zip(["VmRSS:", "RssAnon:", "VmHWM:"]) {
            *sum += procfs::status_kib(pid, field).unwrap_or(0);
        }
    }
    Some((usage.saturating_sub(inactive), max, process))
}

/// The memory of every running container of the pods in `ns` (on this machine's node).
pub async fn pod_memory(client: &Client, ns: &str) -> Result<Vec<ContainerMemory>, Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::Kube)?;
    let mut all = Vec::new();
    for pod in pods.items {
        let name = pod.name_any();
        let statuses = pod.status.and_then(|s| s.container_statuses);
        for status in statuses.into_iter().flatten() {
            let Some(id) = status.container_id else {
                continue;
            };
            let id = id.rsplit('/').next().unwrap_or_default();
            if let Some((working_set, max_usage, [rss, rss_anon, hwm])) = container_memory(id) {
                all.push(ContainerMemory {
                    pod: name.clone(),
                    container: status.name.clone(),
                    working_set,
                    max_usage,
                    rss,
                    rss_anon,
                    hwm,
                });
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "spec:\n  replicas: 3\n          args:\n            - --controllerring=checksums\n            - --lease-duration=15s\n            - --log-format=json\n          env:\n";

    #[test]
    fn extra_flags_replace_the_examples_own_and_others_are_added() {
        let manifest = example_with(
            EXAMPLE,
            4,
            &[
                "--lease-duration=45s",
                "--record-file=/dev/stdout",
                "--stable-name",
            ],
        )
        .expect("manifest");
        assert_eq!(
            manifest,
            "spec:\n  replicas: 4\n          args:\n            - --controllerring=checksums\n            - --lease-duration=45s\n            - --log-format=json\n            - --record-file=/dev/stdout\n            - --stable-name\n          env:\n"
        );
    }

    #[test]
    fn a_manifest_without_its_anchors_names_the_missing_line() {
        assert_eq!(
            example_with(&EXAMPLE.replace("replicas: 3", "replicas: 2"), 3, &[]),
            Err("replicas: 3")
        );
        assert_eq!(
            example_with(
                &EXAMPLE.replace("--log-format=json", "--log-format=plain"),
                3,
                &[]
            ),
            Err("- --log-format=json")
        );
    }

    #[test]
    fn the_shipped_example_has_the_lines_the_harness_changes() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/examples/statefulset-shards.yaml");
        let example = std::fs::read_to_string(path).expect("the example");
        let manifest = example_with(&example, 3, &["--lease-duration=45s"]).expect("manifest");
        assert!(manifest.contains("- --lease-duration=45s\n"));
        assert!(!manifest.contains("--lease-duration=15s"));
    }
}
