//! Release: Idle → Deleting → (Delete) → Speculative.

use bigfleet_model::{Machine, MachineState};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;

use super::provider::{Landed, Leg};
use super::{Fail, Flow, Run};
use crate::links::{DecideLink, GatewayLink, ProviderLink};
use crate::outcome::Outcome;

const DELETE: Leg = Leg {
    rpc: "delete",
    doing: "deleting",
    from: MachineState::Idle,
    via: MachineState::Deleting,
    to: MachineState::Speculative,
    on_error: Outcome::ProviderError,
    reason: "release: deleted",
};

impl<D: DecideLink, G: GatewayLink, P: ProviderLink> Run<'_, D, G, P> {
    /// Release: Idle → Deleting → (Delete) → Speculative. Any refusal,
    /// including UNIMPLEMENTED, is a contract violation: decide only
    /// releases capacity types a provider must be able to delete.
    pub(super) async fn release(&mut self, machine: &Machine) -> Flow<String> {
        if machine.state != MachineState::Idle {
            return Err(Fail::stale("release needs an idle machine", machine.state));
        }
        self.transition(
            DELETE.from,
            DELETE.via,
            mesh::MachinePatch::default(),
            "release: deleting",
        )
        .await?;
        let landed = self
            .actuate(&DELETE, pb::DeleteRequest::default(), |view| {
                mesh::MachinePatch {
                    // An empty HostRef clears the host: the id survives as a
                    // quota slot without hardware.
                    host: Some(pb::HostRef::default()),
                    provider_view: Some(view.raw),
                    ..Default::default()
                }
            })
            .await?;
        Ok(match landed {
            Landed::Arrived => "released to speculative".to_owned(),
            Landed::Pending(note) => note,
        })
    }
}
