//! Installs CRDs (the chart's ClusterRing and ControllerRing CRDs, tests' own) into a control plane and waits
//! until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};

use crate::Error;

/// The ring CRD files shipped in the Helm chart.
pub const RING_CRDS: [&str; 2] = [
    include_str!("../../charts/sharder/crds/clusterrings.sharding.timebertt.dev.yaml"),
    include_str!("../../charts/sharder/crds/controllerrings.sharding.timebertt.dev.yaml"),
];

/// Installs the chart's ClusterRing and ControllerRing CRDs ([`install_crd`]; calling it again
/// is harmless) and waits until the apiserver reports them Established.
pub async fn install_ring_crds(client: &Client) -> Result<(), Error> {
    for file in RING_CRDS {
        install_chart_crd(client, file).await?;
    }
    Ok(())
}

/// Installs one of the chart's [`RING_CRDS`] ([`install_crd`]).
pub async fn install_chart_crd(client: &Client, file: &str) -> Result<(), Error> {
    let crd: CustomResourceDefinition = serde_yaml::from_str(file)
        .map_err(|e| Error::Provision(format!("the chart's CRD does not parse: {e}")))?;
    install_crd(client, &crd).await.map(drop)
}

/// Applies `crd` server-side, as Helm 4 applies a chart's CRDs (so calling it again is
/// harmless), and waits until the apiserver reports it Established.
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
