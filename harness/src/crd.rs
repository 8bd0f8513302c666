//! Installs CRDs (the checked-in ClusterRing CRD, tests' own) into a control plane and waits
//! until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};

use crate::Error;

/// The CRD file shipped in the Helm chart.
pub const CLUSTER_RING_CRD: &str =
    include_str!("../../charts/sharder/crds/clusterrings.sharding.timebertt.dev.yaml");

/// Applies the chart's ClusterRing CRD (server-side apply, so calling it again is harmless) and
/// waits until the apiserver reports it Established.
pub async fn install_cluster_ring_crd(client: &Client) -> Result<CustomResourceDefinition, Error> {
    let crd: CustomResourceDefinition = serde_yaml::from_str(CLUSTER_RING_CRD)
        .map_err(|e| Error::Provision(format!("the chart's CRD does not parse: {e}")))?;
    install_crd(client, &crd).await
}

/// Applies `crd` (server-side apply, so calling it again is harmless) and waits until the
/// apiserver reports it Established.
pub async fn install_crd(
    client: &Client,
    crd: &CustomResourceDefinition,
) -> Result<CustomResourceDefinition, Error> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("sharder-tests").force(),
        &Patch::Apply(crd),
    )
    .await
    .map_err(Error::Kube)?;
    let established = await_condition(api, &name, conditions::is_crd_established());
    match tokio::time::timeout(Duration::from_secs(30), established).await {
        Ok(Ok(Some(crd))) => Ok(crd),
        Ok(Ok(None)) => Err(Error::NotReady(format!(
            "CRD {name} was deleted while waiting"
        ))),
        Ok(Err(e)) => Err(Error::NotReady(format!("waiting for CRD {name}: {e}"))),
        Err(_) => Err(Error::NotReady(format!(
            "CRD {name} not Established within 30s"
        ))),
    }
}
