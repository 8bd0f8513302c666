//! Real Helm (the Helm v4 SDK from PyPI's `helm-python-sdk`, provisioned by
//! `harness/helm/provision.sh`) for the chart tests: lint, render, install, upgrade, uninstall.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use crate::Error;
use crate::supervisor::blocking;

/// The YAML documents of a manifest (empty documents skipped).
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let mut all = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document).map_err(|e| e.to_string())?;
        if !value.is_null() {
            all.push(value);
        }
    }
    Ok(all)
}

/// The Helm SDK, provisioned once per machine.
#[derive(Debug)]
pub struct Helm {
    pythonpath: PathBuf,
    script: PathBuf,
}

/// The chart in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/sharder")
}

fn provision() -> Result<Helm, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("helm");
    let mut provision = Command::new("bash");
    provision
        .arg(dir.join("provision.sh"))
        .stderr(Stdio::inherit());
    let output = blocking(|| provision.output())
        .map_err(|e| format!("cannot run harness/helm/provision.sh: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "harness/helm/provision.sh failed: {}",
            output.status
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pythonpath = stdout
        .lines()
        .last()
        .ok_or("harness/helm/provision.sh printed nothing")?;
    Ok(Helm {
        pythonpath: PathBuf::from(pythonpath.trim()),
        script: dir.join("helm.py"),
    })
}

impl Helm {
    /// The provisioned Helm.
    pub fn get() -> Result<&'static Helm, Error> {
        static HELM: OnceLock<Result<Helm, String>> = OnceLock::new();
        HELM.get_or_init(provision)
            .as_ref()
            .map_err(|e| Error::Provision(e.clone()))
    }

    /// Runs one command of `harness/helm/helm.py`; its JSON output, or Helm's error message.
    pub fn run(&self, args: &[&str]) -> Result<Value, String> {
        let mut helm = Command::new("python3");
        helm.arg(&self.script)
            .args(args)
            .env("PYTHONPATH", &self.pythonpath);
        let output = blocking(|| helm.output()).map_err(|e| format!("cannot run python3: {e}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        serde_json::from_slice(&output.stdout).map_err(|e| format!("helm.py output: {e}"))
    }

    /// `command` on this repository's chart with `values` as release `release` in `namespace`,
    /// plus `extra` arguments.
    fn run_chart(
        &self,
        command: &str,
        values: &Value,
        release: &str,
        namespace: &str,
        extra: &[&str],
    ) -> Result<Value, String> {
        let chart = chart_dir();
        let values = values.to_string();
        let mut args = vec![
            command,
            chart.to_str().unwrap_or_default(),
            "--values",
            &values,
            "--name",
            release,
            "--namespace",
            namespace,
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// `helm lint` of the chart with `values` (for `kube_version`, e.g. `v1.33.0`).
    pub fn lint(&self, values: &Value, kube_version: Option<&str>) -> Result<Value, String> {
        let chart = chart_dir();
        let values = values.to_string();
        let mut args = vec![
            "lint",
            chart.to_str().unwrap_or_default(),
            "--values",
            &values,
        ];
        if let Some(v) = kube_version {
            args.extend(["--kube-version", v]);
        }
        self.run(&args)
    }

    /// `helm template`: every rendered file by path (NOTES.txt included).
    pub fn render_files(
        &self,
        values: &Value,
        release: &str,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, String> {
        let files = self.run_chart("render", values, release, namespace, &[])?;
        serde_json::from_value(files).map_err(|e| e.to_string())
    }

    /// `helm template`: the rendered manifests, as documents.
    pub fn render(
        &self,
        values: &Value,
        release: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, String> {
        let mut all = Vec::new();
        for (file, text) in self.render_files(values, release, namespace)? {
            if !file.ends_with("NOTES.txt") {
                all.extend(documents(&text).map_err(|e| format!("{file}: {e}"))?);
            }
        }
        Ok(all)
    }

    /// The rendered NOTES.txt.
    pub fn notes(&self, values: &Value, release: &str, namespace: &str) -> Result<String, String> {
        Ok(self
            .render_files(values, release, namespace)?
            .into_iter()
            .find(|(file, _)| file.ends_with("NOTES.txt"))
            .map(|(_, text)| text)
            .unwrap_or_default())
    }

    /// `helm install` or `helm upgrade` (`command`) of the chart into the cluster of `kubeconfig`.
    pub fn deploy(
        &self,
        command: &str,
        values: &Value,
        release: &str,
        namespace: &str,
        kubeconfig: &Path,
    ) -> Result<Value, String> {
        let kubeconfig = kubeconfig.to_str().unwrap_or_default();
        self.run_chart(
            command,
            values,
            release,
            namespace,
            &["--kubeconfig", kubeconfig],
        )
    }
}
