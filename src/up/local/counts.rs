//! Machines per state, by the short state names the progress view and summary print.

use std::collections::BTreeMap;

use bigfleet_proto::v1alpha1 as pb;
use svc_inspect::view::{MACHINE_STATES, short_state};

/// Machines per state name (`CONFIGURED`, `IDLE`, ...), every state present.
pub fn count_by_state(machines: &[pb::Machine]) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = MACHINE_STATES
        .into_iter()
        .map(|s| (state_name(s as i32), 0))
        .collect();
    for machine in machines {
        *m.entry(state_name(machine.state)).or_default() += 1;
    }
    m
}

/// `MACHINE_STATE_CONFIGURED` ⇒ `CONFIGURED`.
pub fn state_name(state: i32) -> String {
    pb::MachineState::try_from(state)
        .map(|s| short_state(s.as_str_name()).to_owned())
        .unwrap_or_else(|_| format!("STATE_{state}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_state() {
        let m = |id: &str, st: pb::MachineState| pb::Machine {
            id: id.into(),
            state: st as i32,
            ..Default::default()
        };
        let c = count_by_state(&[
            m("a", pb::MachineState::Configured),
            m("b", pb::MachineState::Configured),
            m("c", pb::MachineState::Idle),
        ]);
        assert_eq!(c["CONFIGURED"], 2);
        assert_eq!(c["IDLE"], 1);
        assert_eq!(c["FAILED"], 0);
        assert_eq!(c.len(), 8);
    }
}
