//! Provision (Speculative → Creating → Idle, then bootstrap) and Bootstrap
//! (Idle → Configuring → Configured with the operator's blob).

use std::collections::BTreeMap;
use std::time::Duration;

use bigfleet_conv as conv;
use bigfleet_model::{Assignment, Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::request_bootstrap_response::Outcome as BootstrapReply;
use bigfleet_proto::v1alpha1 as pb;
use tokio::time::Instant;

use super::provider::{Landed, Leg};
use super::steps::{Interrupt, describe};
use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

/// The five `bigfleet.lucy.sh/` keys for an assignment, encoded by the model.
fn assignment_metadata(a: &Assignment) -> BTreeMap<String, String> {
    Machine {
        assigned_priority: a.priority,
        assigned_interruption_penalty_dollars: a.interruption_penalty_dollars,
        assigned_reclamation_penalty_dollars: a.reclamation_penalty_dollars,
        assigned_need_fingerprint: a.need_fingerprint.clone(),
        assigned_group: a.group.clone(),
        ..Machine::default()
    }
    .encode_shard_metadata()
}

const CREATE: Leg = Leg {
    rpc: "create",
    doing: "creating",
    from: MachineState::Speculative,
    via: MachineState::Creating,
    to: MachineState::Idle,
    on_error: Outcome::ProviderError,
    reason: "provision: create acknowledged idle",
};

const CONFIGURE: Leg = Leg {
    rpc: "configure",
    doing: "configuring",
    from: MachineState::Idle,
    via: MachineState::Configuring,
    to: MachineState::Configured,
    on_error: Outcome::ConfigureError,
    reason: "bootstrap: configured",
};

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Speculative → Creating → (Create) → Idle, then Bootstrap.
    pub(super) async fn provision(
        &mut self,
        machine: &Machine,
        cluster: &str,
        a: &Assignment,
    ) -> Flow<String> {
        if machine.state != MachineState::Speculative {
            return Err(Fail::stale(
                "provision needs a speculative machine",
                machine.state,
            ));
        }
        // ADR-0052: the planned need is stamped at Creating so decide can
        // credit the in-flight machine to it.
        self.transition(
            CREATE.from,
            CREATE.via,
            mesh::MachinePatch {
                assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                assigned_group: Some(a.group.clone()),
                ..Default::default()
            },
            "provision: create requested",
        )
        .await?;
        let landed = self
            .actuate(&CREATE, pb::CreateRequest::default(), |view| {
                mesh::MachinePatch {
                    host: view.host,
                    provider_view: Some(view.raw),
                    ..Default::default()
                }
            })
            .await?;
        match landed {
            Landed::Arrived => self
                .bootstrap_idle(cluster, a)
                .await
                .map(|d| format!("created; {d}")),
            Landed::Pending(note) => Ok(note),
        }
    }

    /// Idle → Configuring → (blob, Configure) → Configured; a machine
    /// already Configured for the same cluster and need is success.
    pub(super) async fn bootstrap(
        &mut self,
        machine: &Machine,
        cluster: &str,
        a: &Assignment,
    ) -> Flow<String> {
        if machine.state == MachineState::Configured
            && machine.cluster == cluster
            && machine.assigned_need_fingerprint == a.need_fingerprint
        {
            return Ok("already configured for this cluster and need".to_owned());
        }
        if machine.state != MachineState::Idle {
            return Err(Fail::stale(
                "bootstrap needs an idle machine",
                machine.state,
            ));
        }
        self.bootstrap_idle(cluster, a).await
    }

    pub(super) async fn bootstrap_idle(&mut self, cluster: &str, a: &Assignment) -> Flow<String> {
        let phase_started = Instant::now();
        // Cluster, need and group are stamped early so decide's Phase 1
        // credits the in-flight machine to its need.
        self.transition(
            CONFIGURE.from,
            CONFIGURE.via,
            mesh::MachinePatch {
                cluster: Some(cluster.to_owned()),
                assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                assigned_group: Some(a.group.clone()),
                ..Default::default()
            },
            "bootstrap: configuring",
        )
        .await?;

        let blob = self.fetch_blob(cluster, a).await?;

        let metadata = assignment_metadata(a);
        let landed = self
            .actuate(
                &CONFIGURE,
                pb::ConfigureRequest {
                    cluster_id: cluster.to_owned(),
                    bootstrap_blob: blob,
                    shard_metadata: metadata.clone(),
                    ..Default::default()
                },
                |view| mesh::MachinePatch {
                    assigned_priority: Some(a.priority),
                    assigned_interruption_penalty_dollars: Some(a.interruption_penalty_dollars),
                    assigned_reclamation_penalty_dollars: Some(a.reclamation_penalty_dollars),
                    assigned_need_fingerprint: Some(a.need_fingerprint.clone()),
                    assigned_group: Some(a.group.clone()),
                    shard_metadata: metadata.clone().into_iter().collect(),
                    provider_view: Some(view.raw),
                    ..Default::default()
                },
            )
            .await?;
        Ok(
            landed.timed_note(&self.ex.metrics.configure_phase, phase_started, || {
                format!("configured for {cluster}")
            }),
        )
    }

    /// The operator's bootstrap blob; every way of not getting one happens
    /// before the provider is touched, so each rolls the machine back to
    /// Idle (the Configuring → Idle rollback edge of the state table) rather than failing good hardware.
    pub(super) async fn fetch_blob(&self, cluster: &str, a: &Assignment) -> Flow<Vec<u8>> {
        let wait = self.ex.cfg.bootstrap_timeout.min(self.remaining());
        let req = mesh::RequestBootstrapRequest {
            cluster_id: cluster.to_owned(),
            requirements: conv::requirements_to_proto(&a.requirements),
            timeout_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX).max(1),
            machine_id: self.machine_id.clone(),
            need_fingerprint: a.need_fingerprint.clone(),
        };
        let started = Instant::now();
        // A little slack past the gateway's own timeout, so its TIMEOUT
        // answer (not our local clock) normally decides.
        let local = tokio::time::timeout(
            wait + Duration::from_millis(250),
            self.ex.gateway.request_bootstrap(req, wait),
        );
        let answer = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupt::Abandoned),
            r = local => Ok(r),
        };
        self.ex
            .metrics
            .request_bootstrap
            .observe(started.elapsed().as_secs_f64());
        let resp = match answer {
            Err(why) => return Err(self.interrupted(why, "bootstrap blob")),
            Ok(Err(_)) => {
                return Err(self
                    .rollback(
                        Outcome::BlobError,
                        format!(
                            "bootstrap blob: no answer within {}",
                            humantime::format_duration(wait)
                        ),
                    )
                    .await);
            }
            Ok(Ok(Err(status))) => {
                return Err(self
                    .rollback(
                        Outcome::BlobError,
                        format!("bootstrap blob: gateway: {}", describe(&status)),
                    )
                    .await);
            }
            Ok(Ok(Ok(resp))) => resp,
        };
        let message = resp.message;
        match resp.outcome {
            Some(BootstrapReply::Blob(blob)) => Ok(blob),
            Some(BootstrapReply::Error(code)) => {
                let (outcome, why) = match mesh::BootstrapError::try_from(code) {
                    Ok(mesh::BootstrapError::NoSession) => (
                        Outcome::NoSession,
                        format!("bootstrap blob: cluster {cluster} has no session"),
                    ),
                    Ok(mesh::BootstrapError::Timeout) => (
                        Outcome::BlobError,
                        format!("bootstrap blob: operator did not answer: {message}"),
                    ),
                    Ok(mesh::BootstrapError::OperatorError) => (
                        Outcome::BlobError,
                        format!("bootstrap blob: operator cannot satisfy the need: {message}"),
                    ),
                    _ => (
                        Outcome::BlobError,
                        format!("bootstrap blob: unknown gateway error {code}: {message}"),
                    ),
                };
                Err(self.rollback(outcome, why).await)
            }
            None => Err(self
                .rollback(
                    Outcome::BlobError,
                    "bootstrap blob: gateway answered with neither blob nor error".to_owned(),
                )
                .await),
        }
    }
}
