//! Release: Idle → Deleting → (Delete) → Speculative.

use bigfleet_model::{Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;

use super::provider::Answer;
use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Release: Idle → Deleting → (Delete) → Speculative. Any refusal,
    /// including UNIMPLEMENTED, is a contract violation: decide only
    /// releases capacity types a provider must be able to delete.
    pub(super) async fn release(&mut self, machine: &Machine) -> Flow<String> {
        if machine.state != MachineState::Idle {
            return Err(Fail::new(
                Outcome::StaleState,
                format!(
                    "release needs an idle machine, decide handed out one in {}",
                    machine.state
                ),
            ));
        }
        self.transition(
            MachineState::Idle,
            MachineState::Deleting,
            mesh::MachinePatch::default(),
            "release: deleting",
        )
        .await?;
        let ex = self.ex;
        let machine_id = self.machine_id.clone();
        let result = self
            .provider_call("delete", |s, t| {
                ex.provider.delete(
                    pb::DeleteRequest {
                        machine_id: machine_id.clone(),
                        shard_id: s.shard_id,
                        shard_epoch: s.epoch,
                        sequence_number: s.sequence,
                    },
                    t,
                )
            })
            .await;
        let view = match self
            .read_answer(
                MachineState::Deleting,
                "delete",
                result,
                Outcome::ProviderError,
            )
            .await?
        {
            Answer::View(v) => *v,
            Answer::Async(note) => return Ok(note),
        };
        let op = &view.operation_id;
        match view.state {
            MachineState::Speculative => {
                self.transition(
                    MachineState::Deleting,
                    MachineState::Speculative,
                    mesh::MachinePatch {
                        // An empty HostRef clears the host: the id survives
                        // as a quota slot without hardware.
                        host: Some(pb::HostRef::default()),
                        provider_view: Some(view.raw),
                        ..Default::default()
                    },
                    "release: deleted",
                )
                .await?;
                Ok("released to speculative".to_owned())
            }
            MachineState::Idle | MachineState::Deleting => Ok(format!(
                "delete accepted as {op:?}, provider still deleting; reconcile completes it"
            )),
            MachineState::Failed => Err(self
                .mark_failed(
                    MachineState::Deleting,
                    Outcome::ProviderError,
                    format!("delete: {}", view.last_error),
                )
                .await),
            other => Err(self
                .mark_failed(
                    MachineState::Deleting,
                    Outcome::ProviderError,
                    format!("delete: provider acknowledged in unexpected state {other}"),
                )
                .await),
        }
    }
}
