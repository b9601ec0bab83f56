use super::*;
use proptest::prelude::*;

fn provider(config: ProviderConfig) -> FakeProvider {
    FakeProvider::from_catalog(&Catalog::builtin(), config).unwrap()
}

fn instant() -> FakeProvider {
    provider(ProviderConfig::default())
}

fn first(p: &FakeProvider, state: MachineState) -> String {
    p.ids_in_state(state).into_iter().next().unwrap()
}

#[test]
fn state_names_are_the_lower_case_wire_names() {
    let states: Vec<MachineState> = (0..16)
        .filter_map(|i| MachineState::try_from(i).ok())
        .collect();
    assert_eq!(states.len(), 9);
    for s in states {
        let wire = s.as_str_name().trim_start_matches("MACHINE_STATE_");
        assert_eq!(state_name(s), wire.to_ascii_lowercase(), "{s:?}");
    }
}

fn create(id: &str, shard: &str, epoch: i64, seq: i64) -> CreateRequest {
    CreateRequest {
        machine_id: id.into(),
        shard_id: shard.into(),
        shard_epoch: epoch,
        sequence_number: seq,
    }
}

fn configure(id: &str, cluster: &str, md: &[(&str, &str)], seq: i64) -> ConfigureRequest {
    ConfigureRequest {
        machine_id: id.into(),
        cluster_id: cluster.into(),
        bootstrap_blob: vec![1, 2, 3],
        shard_id: "s".into(),
        shard_epoch: 1,
        sequence_number: seq,
        shard_metadata: md.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
    }
}

fn drain(id: &str, seq: i64) -> DrainRequest {
    DrainRequest {
        machine_id: id.into(),
        grace_period_seconds: 0,
        shard_id: "s".into(),
        shard_epoch: 1,
        sequence_number: seq,
    }
}

fn delete(id: &str, seq: i64) -> DeleteRequest {
    DeleteRequest {
        machine_id: id.into(),
        shard_id: "s".into(),
        shard_epoch: 1,
        sequence_number: seq,
    }
}

fn state(p: &FakeProvider, id: &str) -> MachineState {
    MachineState::try_from(p.get(id).unwrap().state).unwrap()
}

fn code(r: Result<TransitionAck, ProviderError>) -> tonic::Code {
    r.unwrap_err().code()
}

fn ack_state(a: &TransitionAck) -> MachineState {
    MachineState::try_from(a.machine.as_ref().unwrap().state).unwrap()
}

// ---- lifecycle & idempotency ----------------------------------------------------------

#[test]
fn instant_lifecycle_sets_and_clears_host_and_binding() {
    let p = instant();
    let id = first(&p, MachineState::Speculative);
    assert!(p.get(&id).unwrap().host.is_none());

    let a = p.create(&create(&id, "s", 1, 1)).unwrap();
    assert_eq!(ack_state(&a), MachineState::Idle);
    let m = p.get(&id).unwrap();
    let host = m.host.unwrap();
    assert_eq!(
        (host.provider.as_str(), host.r#ref.as_str()),
        ("fake", id.as_str())
    );

    p.configure(&configure(&id, "c1", &[("k", "v")], 2))
        .unwrap();
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Configured as i32);
    assert_eq!(m.cluster, "c1");
    assert_eq!(m.shard_metadata.get("k").map(String::as_str), Some("v"));

    p.drain(&drain(&id, 3)).unwrap();
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Idle as i32);
    assert_eq!(m.cluster, "");
    assert!(m.shard_metadata.is_empty());
    assert!(m.host.is_some());

    p.delete(&delete(&id, 4)).unwrap();
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Speculative as i32);
    assert!(m.host.is_none());
}

#[test]
fn repeats_return_the_same_operation_id_until_the_machine_moves_on() {
    let p = provider(ProviderConfig {
        transitions: TransitionModel::all(Completion::Staged),
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Speculative);
    let a = p.create(&create(&id, "s", 1, 1)).unwrap();
    assert!(a.operation_id.starts_with("op-"));
    assert_eq!(ack_state(&a), MachineState::Creating);
    // Repeat while in flight: same id, no restart.
    let b = p.create(&create(&id, "s", 1, 2)).unwrap();
    assert_eq!(a.operation_id, b.operation_id);
    let rev = p.revision();
    p.complete_staged(&id).unwrap();
    assert!(p.revision() > rev);
    // Repeat after reaching the target: still the same id.
    let c = p.create(&create(&id, "s", 1, 3)).unwrap();
    assert_eq!(a.operation_id, c.operation_id);
    assert_eq!(state(&p, &id), MachineState::Idle);

    let cfg = p.configure(&configure(&id, "c", &[], 4)).unwrap();
    assert_ne!(cfg.operation_id, a.operation_id);
    assert_eq!(
        p.configure(&configure(&id, "c", &[], 5))
            .unwrap()
            .operation_id,
        cfg.operation_id
    );
    p.complete_staged(&id).unwrap();
    let d1 = p.drain(&drain(&id, 6)).unwrap();
    assert_eq!(
        p.drain(&drain(&id, 7)).unwrap().operation_id,
        d1.operation_id
    );
    p.complete_staged(&id).unwrap();
    assert_eq!(
        p.drain(&drain(&id, 8)).unwrap().operation_id,
        d1.operation_id
    );
    // Create is not a repeat any more: IDLE came from the drain.
    assert_eq!(
        code(p.create(&create(&id, "s", 1, 9))),
        tonic::Code::Internal
    );

    let del = p.delete(&delete(&id, 10)).unwrap();
    assert_eq!(ack_state(&del), MachineState::Deleting);
    assert_eq!(
        p.delete(&delete(&id, 11)).unwrap().operation_id,
        del.operation_id
    );
    p.complete_staged(&id).unwrap();
    assert_eq!(
        p.delete(&delete(&id, 12)).unwrap().operation_id,
        del.operation_id
    );
    // Back to SPECULATIVE: a new Create mints a fresh id.
    let again = p.create(&create(&id, "s", 1, 13)).unwrap();
    assert_ne!(again.operation_id, a.operation_id);
}

#[test]
fn replays_do_not_bump_the_revision() {
    let p = instant();
    let id = first(&p, MachineState::Speculative);
    p.create(&create(&id, "s", 1, 1)).unwrap();
    let rev = p.revision();
    p.create(&create(&id, "s", 1, 2)).unwrap();
    assert_eq!(p.revision(), rev);
}

#[test]
fn invalid_transitions_are_internal_never_failed_precondition() {
    let p = instant();
    let spec = first(&p, MachineState::Speculative);
    let configured = first(&p, MachineState::Configured);
    let idle = first(&p, MachineState::Idle);
    assert_eq!(code(p.drain(&drain(&spec, 1))), tonic::Code::Internal);
    assert_eq!(
        code(p.delete(&delete(&configured, 2))),
        tonic::Code::Internal
    );
    assert_eq!(
        code(p.configure(&configure(&spec, "c", &[], 3))),
        tonic::Code::Internal
    );
    assert_eq!(
        code(p.create(&create(&idle, "s", 1, 4))),
        tonic::Code::Internal
    );
    assert_eq!(
        code(p.configure(&configure(&idle, "", &[], 5))),
        tonic::Code::InvalidArgument
    );
    assert_eq!(state(&p, &spec), MachineState::Speculative);
    assert_eq!(state(&p, &configured), MachineState::Configured);
}

#[test]
fn unknown_machine_and_unsupported_delete() {
    let p = instant();
    assert_eq!(p.get("nope").unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(
        code(p.create(&create("nope", "s", 1, 1))),
        tonic::Code::NotFound
    );
    p.update_config(|c| c.delete_supported = false);
    let idle = first(&p, MachineState::Idle);
    assert_eq!(
        code(p.delete(&delete(&idle, 1))),
        tonic::Code::Unimplemented
    );
    assert_eq!(state(&p, &idle), MachineState::Idle);
}

// ---- fencing ----------------------------------------------------------------------------

#[test]
fn fencing_cases_of_the_conformance_suite_at_store_level() {
    let p = instant();
    let spec = p.ids_in_state(MachineState::Speculative);
    let fp = tonic::Code::FailedPrecondition;

    // Unknown shard accepted; exact replay rejected.
    let m = &spec[0];
    p.create(&create(m, "u", 1, 1)).unwrap();
    assert_eq!(code(p.create(&create(m, "u", 1, 1))), fp);

    // Stale epoch.
    let m = &spec[1];
    p.create(&create(m, "e", 2, 1)).unwrap();
    assert_eq!(code(p.create(&create(m, "e", 1, 99))), fp);

    // Stale sequence.
    let m = &spec[2];
    p.create(&create(m, "q", 1, 5)).unwrap();
    assert_eq!(code(p.create(&create(m, "q", 1, 5))), fp);
    assert_eq!(code(p.create(&create(m, "q", 1, 4))), fp);

    // Per-machine isolation.
    let (a, b) = (&spec[3], &spec[4]);
    p.create(&create(a, "i", 1, 30)).unwrap();
    p.create(&create(b, "i", 1, 7)).unwrap();
    assert_eq!(code(p.create(&create(b, "i", 1, 7))), fp);
    assert_eq!(code(p.create(&create(a, "i", 1, 30))), fp);
    assert_eq!(code(p.create(&create(b, "i", 0, 999))), fp);

    // New epoch resets the sequence space.
    let m = &spec[5];
    p.create(&create(m, "n", 1, 1000)).unwrap();
    p.create(&create(m, "n", 2, 1)).unwrap();

    // Reads unaffected.
    assert!(p.get(m).is_ok());
    assert!(!p.list(&ListFilter::default()).machines.is_empty());

    // Shards are independent of each other on the same machine.
    p.create(&create(m, "other-shard", 0, 1)).unwrap();
}

#[test]
fn fence_runs_before_not_found_and_before_idempotent_replay() {
    let p = instant();
    // Unknown machine: the token is recorded, then NOT_FOUND; its replay is fenced.
    assert_eq!(
        code(p.create(&create("ghost", "z", 1, 1))),
        tonic::Code::NotFound
    );
    assert_eq!(
        p.fence_mark("z", "ghost"),
        Some(Mark {
            epoch: 1,
            sequence: 1
        })
    );
    assert_eq!(
        code(p.create(&create("ghost", "z", 1, 1))),
        tonic::Code::FailedPrecondition
    );

    // A zombie replaying an accepted call gets no cached operation id.
    let id = first(&p, MachineState::Speculative);
    p.create(&create(&id, "z", 5, 5)).unwrap();
    let err = p.create(&create(&id, "z", 4, 100)).unwrap_err();
    assert!(matches!(err, ProviderError::Fenced { .. }), "{err}");
    assert!(!err.to_string().contains("op-"));
}

#[test]
fn a_passing_token_advances_the_mark_even_when_the_call_then_fails() {
    let p = instant();
    let spec = first(&p, MachineState::Speculative);
    // Invalid transition after a passing token.
    assert_eq!(code(p.drain(&drain(&spec, 10))), tonic::Code::Internal);
    assert_eq!(
        p.fence_mark("s", &spec),
        Some(Mark {
            epoch: 1,
            sequence: 10
        })
    );
    assert_eq!(
        code(p.drain(&drain(&spec, 10))),
        tonic::Code::FailedPrecondition
    );
}

#[test]
fn zero_token_bypasses_fencing() {
    let p = instant();
    let spec = p.ids_in_state(MachineState::Speculative);
    p.create(&create(&spec[0], "", 0, 0)).unwrap();
    p.create(&create(&spec[0], "", 0, 0)).unwrap();
    assert_eq!(p.stats().fence_marks, 0);
    // A non-zero token with an empty shard id is still fenced.
    p.create(&create(&spec[1], "", 1, 1)).unwrap();
    assert_eq!(
        code(p.create(&create(&spec[1], "", 1, 1))),
        tonic::Code::FailedPrecondition
    );
}

#[test]
fn fence_marks_persist_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fence.jsonl");
    let id;
    {
        let p = instant();
        assert_eq!(p.open_fence_file(&path).unwrap(), 0);
        id = first(&p, MachineState::Speculative);
        p.create(&create(&id, "shard-a", 7, 70)).unwrap();
    }
    let p = instant();
    assert_eq!(p.open_fence_file(&path).unwrap(), 1);
    assert_eq!(
        code(p.create(&create(&id, "shard-a", 7, 70))),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        code(p.create(&create(&id, "shard-a", 6, 99))),
        tonic::Code::FailedPrecondition
    );
    p.create(&create(&id, "shard-a", 8, 1)).unwrap();
    // Without the file a restarted provider would have accepted the zombie.
    let forgetful = instant();
    forgetful.create(&create(&id, "shard-a", 7, 70)).unwrap();
}

// ---- metadata ---------------------------------------------------------------------------

#[test]
fn metadata_is_stored_verbatim_echoed_everywhere_and_cleared_with_the_cluster() {
    let p = provider(ProviderConfig {
        transitions: TransitionModel::all(Completion::Staged),
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Idle);
    let md: &[(&str, &str)] = &[
        (
            "bigfleet.lucy.sh/assigned-group",
            "topology.bigfleet/rack\0gang-7",
        ),
        ("bigfleet.lucy.sh/assigned-priority", "100"),
        ("weird \t key", ""),
        ("ünïcødé", "日本\u{1}\r\n"),
    ];
    let want: std::collections::BTreeMap<String, String> =
        md.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    let ack = p.configure(&configure(&id, "c9", md, 1)).unwrap();
    let snap = ack.machine.unwrap();
    assert_eq!(snap.state, MachineState::Configuring as i32);
    assert_eq!((snap.cluster.as_str(), &snap.shard_metadata), ("c9", &want));
    p.complete_staged(&id).unwrap();
    assert_eq!(p.get(&id).unwrap().shard_metadata, want);
    let listed = p.list(&ListFilter::default());
    let m = listed.machines.iter().find(|m| m.id == id).unwrap();
    assert_eq!(m.shard_metadata, want);

    // DRAINING keeps the binding; IDLE clears both.
    let d = p.drain(&drain(&id, 2)).unwrap().machine.unwrap();
    assert_eq!(d.state, MachineState::Draining as i32);
    assert_eq!((d.cluster.as_str(), &d.shard_metadata), ("c9", &want));
    p.complete_staged(&id).unwrap();
    let m = p.get(&id).unwrap();
    assert_eq!(m.cluster, "");
    assert!(m.shard_metadata.is_empty());
}

// ---- revisions, deltas, filters ------------------------------------------------------------

fn rev_of(l: &MachineList) -> Vec<u8> {
    l.revision.clone()
}

fn since(rev: &[u8]) -> ListFilter {
    ListFilter {
        since_revision: rev.to_vec(),
        ..ListFilter::default()
    }
}

#[test]
fn delta_lists_return_exactly_the_changed_machines() {
    let p = instant();
    let full = p.list(&ListFilter::default());
    assert_eq!(full.machines.len(), p.len());
    let r0 = rev_of(&full);
    assert!(std::str::from_utf8(&r0).unwrap().parse::<u64>().is_ok());

    assert!(p.list(&since(&r0)).machines.is_empty());
    let spec = p.ids_in_state(MachineState::Speculative);
    p.create(&create(&spec[0], "", 0, 0)).unwrap();
    let between = rev_of(&p.list(&since(&r0)));
    p.create(&create(&spec[1], "", 0, 0)).unwrap();
    // A cursor taken between two changes sees only the later one.
    let later = p.list(&since(&between));
    assert_eq!(later.machines.len(), 1);
    assert_eq!(later.machines[0].id, spec[1]);
    p.configure(&ConfigureRequest {
        machine_id: spec[0].clone(),
        cluster_id: "c".into(),
        ..Default::default()
    })
    .unwrap();
    let d = p.list(&since(&r0));
    let ids: Vec<&str> = d.machines.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, [spec[0].as_str(), spec[1].as_str()]);
    assert_eq!(d.machines[0].state, MachineState::Configured as i32);

    let r1 = rev_of(&d);
    assert_ne!(r1, r0);
    assert!(p.list(&since(&r1)).machines.is_empty());

    // Malformed, future and foreign cursors get the full state.
    for bad in [
        b"garbage".to_vec(),
        b"1".to_vec(),
        u64::MAX.to_string().into_bytes(),
    ] {
        assert_eq!(p.list(&since(&bad)).machines.len(), p.len(), "{bad:?}");
    }
}

#[test]
fn delta_survives_log_compaction() {
    let p =
        FakeProvider::from_catalog(&Catalog::generated(200, 3), ProviderConfig::default()).unwrap();
    let r0 = rev_of(&p.list(&ListFilter::default()));
    let target = first(&p, MachineState::Idle);
    // Far more changes than the log keeps before compacting (4 × machines + 4096).
    for i in 0..3000 {
        if i % 2 == 0 {
            p.configure(&ConfigureRequest {
                machine_id: target.clone(),
                cluster_id: "c".into(),
                ..Default::default()
            })
            .unwrap();
        } else {
            p.drain(&DrainRequest {
                machine_id: target.clone(),
                ..Default::default()
            })
            .unwrap();
        }
    }
    assert!(p.inner.read().log.len() < 4 * 200 + 4096);
    let d = p.list(&since(&r0));
    assert_eq!(d.machines.len(), 1);
    assert_eq!(d.machines[0].id, target);
}

#[test]
fn removed_machines_vanish_from_full_lists_and_bump_the_revision() {
    let p = instant();
    let r0 = rev_of(&p.list(&ListFilter::default()));
    let idle = first(&p, MachineState::Idle);
    p.remove_machine(&idle).unwrap();
    assert_eq!(p.get(&idle).unwrap_err().code(), tonic::Code::NotFound);
    let full = p.list(&ListFilter::default());
    assert!(full.machines.iter().all(|m| m.id != idle));
    assert_ne!(rev_of(&full), r0);
    // No tombstones: the delta is empty.
    assert!(p.list(&since(&r0)).machines.is_empty());
}

#[test]
fn state_filter_and_max_results() {
    let p = instant();
    let only = |states: &[MachineState]| ListFilter {
        states: states.iter().map(|s| *s as i32).collect(),
        ..ListFilter::default()
    };
    let idle = p.list(&only(&[MachineState::Idle]));
    assert_eq!(idle.machines.len(), p.stats().by_state["idle"]);
    assert!(
        idle.machines
            .iter()
            .all(|m| m.state == MachineState::Idle as i32)
    );
    let two = p.list(&only(&[MachineState::Idle, MachineState::Configured]));
    assert_eq!(
        two.machines.len(),
        p.stats().by_state["idle"] + p.stats().by_state["configured"]
    );
    assert!(p.list(&only(&[MachineState::Deleting])).machines.is_empty());

    let capped = p.list(&ListFilter {
        max_results: 3,
        ..ListFilter::default()
    });
    assert_eq!(capped.machines.len(), 3);
    assert!(
        capped.revision.is_empty(),
        "a truncated list must not offer a cursor"
    );
    let uncapped = p.list(&ListFilter {
        max_results: -5,
        ..ListFilter::default()
    });
    assert_eq!(uncapped.machines.len(), p.len());
}

#[test]
fn fast_encoding_matches_prost_for_every_machine() {
    let p = instant();
    // Give some machines every dynamic field.
    let idle = p.ids_in_state(MachineState::Idle);
    p.configure(&configure(
        &idle[0],
        "c",
        &[("a", "1"), ("", "empty key"), ("z", "")],
        1,
    ))
    .unwrap();
    p.fail_machine(&idle[1], "disk on fire").unwrap();
    p.set_allocatable(&idle[2], BTreeMap::from([("cpu".into(), "1".into())]))
        .unwrap();
    p.add_machine(Machine {
        id: "custom".into(),
        state: MachineState::Configured as i32,
        host: Some(pb::HostRef {
            provider: "elsewhere".into(),
            r#ref: "serial-9".into(),
        }),
        instance_type: "t".into(),
        cluster: "k".into(),
        ..Machine::default()
    })
    .unwrap();
    for filter in [
        ListFilter::default(),
        ListFilter {
            states: vec![MachineState::Failed as i32, MachineState::Configured as i32],
            max_results: 7,
            ..ListFilter::default()
        },
    ] {
        let mut buf = Vec::new();
        let n = p.encode_list(&filter, &mut buf);
        let slow = p.list(&filter);
        assert_eq!(n, slow.machines.len());
        let decoded = MachineList::decode(buf.as_slice()).unwrap();
        assert_eq!(decoded, slow);
        assert_eq!(buf.len(), slow.encoded_len());
    }
    // Renaming the provider changes every own host, and the cached wire form follows.
    p.update_config(|c| c.provider_name = "renamed".into());
    let mut buf = Vec::new();
    p.encode_list(&ListFilter::default(), &mut buf);
    let decoded = MachineList::decode(buf.as_slice()).unwrap();
    assert_eq!(decoded, p.list(&ListFilter::default()));
    let host = p.get(&idle[0]).unwrap().host.unwrap();
    assert_eq!(host.provider, "renamed");
    assert_eq!(p.get("custom").unwrap().host.unwrap().provider, "elsewhere");
}

// ---- transition models, readiness, failures -------------------------------------------------

#[test]
fn timed_transitions_complete_after_their_latency() {
    let p = provider(ProviderConfig {
        transitions: TransitionModel {
            create: Completion::After(Duration::from_millis(30)),
            ..TransitionModel::instant()
        },
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Speculative);
    let ack = p.create(&create(&id, "s", 1, 1)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Creating);
    assert_eq!(state(&p, &id), MachineState::Creating);
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(state(&p, &id), MachineState::Idle);
}

/// A provider whose transitions wait to be completed by hand, with a 20 ms transition
/// timeout, and a machine whose Create it has just accepted.
fn creating_with_a_20ms_timeout() -> (FakeProvider, String) {
    let p = provider(ProviderConfig {
        transitions: TransitionModel::all(Completion::Staged),
        transition_timeout: Some(Duration::from_millis(20)),
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Speculative);
    p.create(&create(&id, "s", 1, 1)).unwrap();
    (p, id)
}

#[test]
fn transition_timeout_fails_stuck_machines() {
    let (p, id) = creating_with_a_20ms_timeout();
    std::thread::sleep(Duration::from_millis(30));
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Failed as i32);
    assert_eq!(m.last_error, "creating timed out");
    // FAILED is terminal for the protocol.
    assert_eq!(
        code(p.create(&create(&id, "s", 1, 2))),
        tonic::Code::Internal
    );
}

#[test]
fn completed_transitions_are_not_failed_by_their_old_timeout() {
    let (p, id) = creating_with_a_20ms_timeout();
    p.complete_staged(&id).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(state(&p, &id), MachineState::Idle);
}

#[test]
fn readiness_hold_keeps_configuring_until_ready() {
    let p = provider(ProviderConfig {
        hold_configuring_until_ready: true,
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Idle);
    let ack = p.configure(&configure(&id, "c", &[], 1)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Configuring);
    assert_eq!(
        p.complete_all(),
        0,
        "a held machine is not a pending transition"
    );
    assert_eq!(
        p.complete_staged(&id).unwrap().state,
        MachineState::Configuring as i32
    );
    let m = p.mark_ready(&id).unwrap();
    assert_eq!(m.state, MachineState::Configured as i32);

    // Per machine, and ready-before-configure passes straight through.
    let p = instant();
    let ids = p.ids_in_state(MachineState::Idle);
    p.require_readiness(&ids[0]).unwrap();
    p.configure(&configure(&ids[0], "c", &[], 1)).unwrap();
    p.configure(&configure(&ids[1], "c", &[], 1)).unwrap();
    assert_eq!(state(&p, &ids[0]), MachineState::Configuring);
    assert_eq!(state(&p, &ids[1]), MachineState::Configured);
    assert_eq!(
        p.mark_ready(&ids[1]).unwrap_err().code(),
        tonic::Code::Internal
    );

    // Ready while the Configure itself is still in flight: it lands straight in CONFIGURED.
    p.update_config(|c| c.transitions.configure = Completion::Staged);
    p.require_readiness(&ids[2]).unwrap();
    p.configure(&configure(&ids[2], "c", &[], 1)).unwrap();
    p.mark_ready(&ids[2]).unwrap();
    assert_eq!(state(&p, &ids[2]), MachineState::Configuring);
    p.complete_staged(&ids[2]).unwrap();
    assert_eq!(state(&p, &ids[2]), MachineState::Configured);
}

#[test]
fn readiness_timeout_fails_with_a_reason() {
    let p = provider(ProviderConfig {
        hold_configuring_until_ready: true,
        transition_timeout: Some(Duration::from_millis(15)),
        ..ProviderConfig::default()
    });
    let id = first(&p, MachineState::Idle);
    p.configure(&configure(&id, "c", &[], 1)).unwrap();
    std::thread::sleep(Duration::from_millis(25));
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Failed as i32);
    assert!(m.last_error.contains("ready"), "{}", m.last_error);
}

#[test]
fn fail_next_rejects_or_dooms_one_call() {
    let p = instant();
    let spec = p.ids_in_state(MachineState::Speculative);
    p.fail_next(
        &spec[0],
        OpKind::Create,
        Injection::Reject {
            code: tonic::Code::Unavailable,
            message: "cloud api down".into(),
        },
    );
    let err = p.create(&create(&spec[0], "s", 1, 1)).unwrap_err();
    assert_eq!(
        (err.code(), err.to_string().as_str()),
        (tonic::Code::Unavailable, "cloud api down")
    );
    assert_eq!(state(&p, &spec[0]), MachineState::Speculative);
    // Only once.
    p.create(&create(&spec[0], "s", 1, 2)).unwrap();

    p.fail_next(
        &spec[1],
        OpKind::Create,
        Injection::Fail {
            message: "no capacity".into(),
        },
    );
    let ack = p.create(&create(&spec[1], "s", 1, 3)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Failed);
    let m = p.get(&spec[1]).unwrap();
    assert_eq!(m.last_error, "no capacity");

    // An injected FAILED_PRECONDITION would read as fencing: it is sent as INTERNAL.
    p.fail_next(
        &spec[2],
        OpKind::Create,
        Injection::Reject {
            code: tonic::Code::FailedPrecondition,
            message: "x".into(),
        },
    );
    assert_eq!(
        code(p.create(&create(&spec[2], "s", 1, 4))),
        tonic::Code::Internal
    );

    // The fence still comes first: a fenced call does not consume the injection.
    assert_eq!(code(p.drain(&drain(&spec[3], 5))), tonic::Code::Internal);
    p.fail_next(
        &spec[3],
        OpKind::Create,
        Injection::Fail {
            message: "later".into(),
        },
    );
    assert_eq!(
        code(p.create(&create(&spec[3], "s", 1, 5))),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(state(&p, &spec[3]), MachineState::Speculative);
    let ack = p.create(&create(&spec[3], "s", 1, 6)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Failed);
}

#[test]
fn injections_queue_per_machine_and_operation() {
    let p = instant();
    let id = first(&p, MachineState::Speculative);
    let reject = |message: &str| Injection::Reject {
        code: tonic::Code::Unavailable,
        message: message.into(),
    };
    p.fail_next(&id, OpKind::Create, reject("first"));
    p.fail_next(&id, OpKind::Create, reject("second"));
    let message = |r: Result<TransitionAck, ProviderError>| r.unwrap_err().to_string();
    assert_eq!(message(p.create(&create(&id, "s", 1, 1))), "first");
    assert_eq!(message(p.create(&create(&id, "s", 1, 2))), "second");
    p.create(&create(&id, "s", 1, 3)).unwrap();
    assert_eq!(state(&p, &id), MachineState::Idle);
}

#[test]
fn a_lying_ack_reports_what_it_was_told_while_the_machine_moves() {
    let p = instant();
    let id = first(&p, MachineState::Idle);
    p.fail_next(
        &id,
        OpKind::Configure,
        Injection::Ack {
            state: MachineState::Creating,
            last_error: "made up".into(),
        },
    );
    let ack = p.configure(&configure(&id, "c", &[], 1)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Creating);
    assert_eq!(ack.machine.as_ref().unwrap().last_error, "made up");
    let m = p.get(&id).unwrap();
    assert_eq!(m.state, MachineState::Configured as i32);
    assert_eq!(m.last_error, "");
    // Once: the next ack is honest again.
    let ack = p.drain(&drain(&id, 2)).unwrap();
    assert_eq!(ack_state(&ack), MachineState::Idle);
}

#[test]
fn every_mutating_call_is_remembered_as_it_arrived_fenced_or_not() {
    let p = instant();
    let id = first(&p, MachineState::Idle);
    let mut req = configure(&id, "c", &[], 7);
    req.bootstrap_blob = b"#cloud-config".to_vec();
    p.configure(&req).unwrap();
    // A stale sequence is fenced, and still remembered.
    assert_eq!(
        code(p.drain(&drain(&id, 7))),
        tonic::Code::FailedPrecondition
    );
    let calls = p.mutation_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].op, calls[0].machine_id.as_str(), calls[0].sequence),
        (OpKind::Configure, id.as_str(), 7)
    );
    assert_eq!(calls[0].bootstrap_blob, b"#cloud-config");
    assert_eq!((calls[1].op, calls[1].sequence), (OpKind::Drain, 7));
    assert!(calls[1].bootstrap_blob.is_empty());

    // Bounded: the oldest go first.
    for seq in 1..=MUTATION_CALLS_KEPT as i64 {
        assert_eq!(
            code(p.delete(&delete("nobody", seq))),
            tonic::Code::NotFound
        );
    }
    let calls = p.mutation_calls();
    assert_eq!(calls.len(), MUTATION_CALLS_KEPT);
    assert!(calls.iter().all(|c| c.op == OpKind::Delete));
}

#[test]
fn a_recorded_fence_turns_away_older_tokens_of_that_shard() {
    let p = instant();
    let id = first(&p, MachineState::Speculative);
    let newer = Mark {
        epoch: 4,
        sequence: 1,
    };
    p.record_fence("s", &id, newer).unwrap();
    assert_eq!(p.fence_mark("s", &id), Some(newer));
    assert_eq!(
        code(p.create(&create(&id, "s", 3, 9))),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(state(&p, &id), MachineState::Speculative);
    // Not backwards: an older mark is refused as the call would be.
    assert!(
        p.record_fence(
            "s",
            &id,
            Mark {
                epoch: 3,
                sequence: 1
            }
        )
        .is_err()
    );
    p.create(&create(&id, "s", 4, 2)).unwrap();
}

#[test]
fn failure_rates_are_seeded_and_follow_the_style() {
    let run = |seed: u64, style: FailureStyle| {
        let p = provider(ProviderConfig {
            failure_rates: FailureRates {
                create: 0.5,
                ..FailureRates::default()
            },
            failure_style: style,
            seed,
            ..ProviderConfig::default()
        });
        p.ids_in_state(MachineState::Speculative)
            .iter()
            .take(200)
            .map(|id| match p.create(&create(id, "", 0, 0)) {
                Ok(a) => ack_state(&a) == MachineState::Failed,
                Err(e) => {
                    assert_eq!(e.code(), tonic::Code::Internal);
                    true
                }
            })
            .collect::<Vec<bool>>()
    };
    let a = run(7, FailureStyle::Reject);
    assert_eq!(a, run(7, FailureStyle::Reject), "same seed, same dice");
    assert_ne!(a, run(8, FailureStyle::Reject));
    let failed = a.iter().filter(|f| **f).count();
    assert!((60..=140).contains(&failed), "{failed} of 200 at rate 0.5");
    let b = run(7, FailureStyle::Fail);
    assert_eq!(
        a, b,
        "the style changes how a failure shows, not which calls fail"
    );
}

#[test]
fn fail_machine_and_set_allocatable_are_changes() {
    let p = instant();
    let r0 = rev_of(&p.list(&ListFilter::default()));
    let id = first(&p, MachineState::Configured);
    p.fail_machine(&id, "gpu fell off the bus").unwrap();
    let idle = first(&p, MachineState::Idle);
    let m = p
        .set_allocatable(
            &idle,
            BTreeMap::from([("nvidia.com/gpu".into(), "7".into())]),
        )
        .unwrap();
    assert_eq!(m.allocatable.unwrap().resources["nvidia.com/gpu"], "7");
    let d = p.list(&since(&r0));
    let mut ids: Vec<_> = d.machines.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    let mut want = vec![id.clone(), idle.clone()];
    want.sort();
    assert_eq!(ids, want);
    let failed = p.get(&id).unwrap();
    assert_eq!(failed.state, MachineState::Failed as i32);
    assert_eq!(failed.last_error, "gpu fell off the bus");
    assert_eq!(
        failed.cluster, "cluster-0",
        "the failure keeps the binding for diagnosis"
    );
}

#[test]
fn shed_speculative_and_add_machines() {
    let p = FakeProvider::builtin();
    let spec = p.stats().by_state["speculative"];
    let removed = p.shed_speculative(0.25);
    assert_eq!(removed.len(), (spec as f64 * 0.25).round() as usize);
    assert_eq!(p.stats().by_state["speculative"], spec - removed.len());
    assert!(p.get(&removed[0]).is_err());

    let r0 = rev_of(&p.list(&ListFilter::default()));
    p.add_machine(Machine {
        id: "extra-1".into(),
        state: MachineState::Idle as i32,
        instance_type: "m.xlarge.32".into(),
        zone: "fake-1a".into(),
        ..Machine::default()
    })
    .unwrap();
    let m = p.get("extra-1").unwrap();
    assert_eq!(m.host.unwrap().r#ref, "extra-1");
    assert!(matches!(
        p.add_machine(Machine {
            id: "extra-1".into(),
            state: 3,
            instance_type: "t".into(),
            ..Machine::default()
        }),
        Err(ProviderError::AlreadyExists { .. })
    ));
    assert!(
        p.add_machine(Machine {
            id: "x".into(),
            state: 0,
            instance_type: "t".into(),
            ..Machine::default()
        })
        .is_err()
    );

    let extra = Catalog::from_json(
        r#"{"instance_types": {"t": {"resources": {"cpu": "2"}}},
            "pools": [{"name": "late", "instance_type": "t", "capacity_type": "spot",
                       "zones": ["z"], "counts": {"speculative": 3}}]}"#,
    )
    .unwrap();
    assert_eq!(p.add_catalog(&extra).unwrap(), 3);
    assert!(matches!(
        p.add_catalog(&extra),
        Err(CatalogError::DuplicateMachine { .. })
    ));
    let d = p.list(&since(&r0));
    assert_eq!(d.machines.len(), 4, "added machines are changes in a delta");
}

#[test]
fn seeded_machines_have_catalog_shape() {
    let p = FakeProvider::builtin();
    let full = p.list(&ListFilter::default());
    assert_eq!(
        full.machines.len() as u64,
        Catalog::builtin().machine_count()
    );
    let gpu = full
        .machines
        .iter()
        .find(|m| m.id == "gpu-h100-000009")
        .unwrap();
    assert_eq!(gpu.instance_type, "bm.gpu.h100.8");
    assert_eq!(gpu.capacity_type, pb::CapacityType::BareMetal as i32);
    assert_eq!(gpu.zone, "fake-1b");
    assert_eq!(gpu.labels[ZONE_LABEL], "fake-1b");
    assert_eq!(gpu.labels[RACK_LABEL], "fake-1b-gpu-h100-rack-0");
    assert_eq!(
        gpu.resources.as_ref().unwrap().resources["nvidia.com/gpu"],
        "8"
    );
    assert_eq!(gpu.allocatable.as_ref().unwrap().resources["cpu"], "190");
    let configured = full
        .machines
        .iter()
        .find(|m| m.state == MachineState::Configured as i32)
        .unwrap();
    assert!(configured.cluster.starts_with("cluster-"));
    let spot = full
        .machines
        .iter()
        .find(|m| m.id.starts_with("cpu-spot"))
        .unwrap();
    assert_eq!(spot.interruption_probability, 0.05);
    assert!(spot.allocatable.is_none());
    for m in &full.machines {
        let needs_host = !matches!(
            MachineState::try_from(m.state).unwrap(),
            MachineState::Speculative | MachineState::Creating
        );
        assert_eq!(m.host.is_some(), needs_host, "{}", m.id);
    }
}

#[test]
fn generate_is_deterministic() {
    let a = FakeProvider::generate(2000, 9).list(&ListFilter::default());
    let b = FakeProvider::generate(2000, 9).list(&ListFilter::default());
    assert_eq!(a.machines, b.machines);
    assert_eq!(a.machines.len(), 2000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever sequence of calls arrives, the counts stay consistent, operation ids for
    /// one (machine, kind) never change while the machine is in that op's states, and the
    /// delta since the start equals the set of machines whose proto changed.
    #[test]
    fn random_call_sequences_keep_the_store_consistent(
        calls in proptest::collection::vec((0usize..4, 0usize..12, 1i64..4), 1..120)
    ) {
        let p = FakeProvider::from_catalog(&Catalog::generated(12, 5), ProviderConfig {
            transitions: TransitionModel::all(Completion::Staged),
            ..ProviderConfig::default()
        }).unwrap();
        let start = p.list(&ListFilter::default());
        let ids: Vec<String> = start.machines.iter().map(|m| m.id.clone()).collect();
        let mut seq = 0;
        for (kind, m, step) in calls {
            seq += 1;
            let id = &ids[m % ids.len()];
            let _ = match kind {
                0 => p.create(&create(id, "s", 1, seq)),
                1 => p.configure(&configure(id, "c", &[("k", "v")], seq)),
                2 => p.drain(&drain(id, seq)),
                _ => p.delete(&delete(id, seq)),
            };
            if step == 3 {
                let _ = p.complete_staged(id);
            }
        }
        let now = p.list(&ListFilter::default());
        let stats = p.stats();
        prop_assert_eq!(stats.by_state.values().sum::<usize>(), now.machines.len());
        for m in &now.machines {
            let s = MachineState::try_from(m.state).unwrap();
            prop_assert!(s != MachineState::Unspecified);
            prop_assert_eq!(!m.cluster.is_empty(), is_bound(s), "{} in {:?}", &m.id, s);
            if !is_bound(s) {
                prop_assert!(m.shard_metadata.is_empty());
            }
        }
        let delta = p.list(&since(&start.revision));
        let changed: Vec<&Machine> = now
            .machines
            .iter()
            .zip(&start.machines)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a)
            .collect();
        // Every machine whose state differs is in the delta (the delta may also hold
        // machines that went somewhere and came back).
        for m in changed {
            prop_assert!(delta.machines.iter().any(|d| d == m), "{} missing from delta", m.id);
        }
        let mut buf = Vec::new();
        p.encode_list(&ListFilter::default(), &mut buf);
        prop_assert_eq!(MachineList::decode(buf.as_slice()).unwrap(), now);
    }
}

#[test]
fn the_actuation_log_holds_accepted_calls_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("actuations.jsonl");
    let p = instant();
    p.open_actuation_log(&path).unwrap();
    let id = first(&p, MachineState::Speculative);
    p.create(&create(&id, "s", 2, 1)).unwrap();
    // A retry with a newer token is a replay; a stale token is fenced and not logged; an
    // invalid transition is refused and not logged.
    p.create(&create(&id, "s", 2, 2)).unwrap();
    assert!(p.create(&create(&id, "s", 1, 9)).is_err());
    assert!(p.drain(&drain(&id, 3)).is_err());
    let log = crate::actuation::read_actuation_log(&path).unwrap();
    let seen: Vec<(&str, i64, bool)> = log
        .iter()
        .map(|a| (a.op.as_str(), a.sequence, a.replay))
        .collect();
    assert_eq!(seen, [("create", 1, false), ("create", 2, true)]);
    assert!(
        log.iter()
            .all(|a| a.machine == id && a.shard == "s" && a.epoch == 2)
    );
    assert_eq!(
        log[0].operation, log[1].operation,
        "the replay names the same operation"
    );
    let audit = crate::actuation::audit(&log);
    assert!(audit.machines_actuated_twice.is_empty());
    assert_eq!(audit.fenced_calls_accepted, 0);
}

#[test]
fn update_machine_is_a_change_and_keeps_the_state_counts() {
    let p = instant();
    let idle = first(&p, MachineState::Idle);
    let idle_before = p.stats().by_state["idle"];
    let ack = p.create(&create(&first(&p, MachineState::Speculative), "s", 1, 1));
    assert!(ack.is_ok());
    let r0 = rev_of(&p.list(&ListFilter::default()));
    let m = p
        .update_machine(&idle, |m| {
            m.state = MachineState::Configured as i32;
            m.cluster = "c9".into();
            m.price_per_hour = f64::NAN;
        })
        .unwrap();
    assert_eq!(
        (m.state, m.cluster.as_str()),
        (MachineState::Configured as i32, "c9")
    );
    assert!(m.price_per_hour.is_nan(), "invalid records pass on purpose");
    // One more idle from the create, one less from the update.
    assert_eq!(p.stats().by_state["idle"], idle_before);
    let delta = p.list(&since(&r0));
    assert_eq!(
        delta
            .machines
            .iter()
            .map(|m| m.id.as_str())
            .collect::<Vec<_>>(),
        [idle.as_str()]
    );
    // An own host stays own: renaming the provider still shows on it.
    p.update_config(|c| c.provider_name = "renamed".into());
    assert_eq!(p.get(&idle).unwrap().host.unwrap().provider, "renamed");
    assert!(matches!(
        p.update_machine(&idle, |m| m.id = "other".into()),
        Err(ProviderError::InvalidArgument(_))
    ));
    assert!(matches!(
        p.update_machine("nope", |_| {}),
        Err(ProviderError::NotFound { .. })
    ));
}

#[test]
fn scripted_list_faults_are_answered_in_order_then_the_truth() {
    let p = instant();
    let all = p.list(&ListFilter::default()).machines.len();
    assert!(p.begin_list(&ListFilter::default()).unwrap().is_none());
    p.script_lists([
        ListFault::Unavailable,
        ListFault::Empty,
        ListFault::Truncated(2),
        ListFault::Invalid,
    ]);
    assert_eq!(p.list_script_len(), 4);
    let cursor = ListFilter {
        since_revision: b"42".to_vec(),
        ..ListFilter::default()
    };
    let down = p.begin_list(&cursor).unwrap_err();
    assert_eq!(down.code(), tonic::Code::Unavailable);
    assert_eq!(p.last_since_revision(), b"42");
    let empty = p.begin_list(&ListFilter::default()).unwrap().unwrap();
    assert!(empty.machines.is_empty() && empty.revision.is_empty());
    assert!(p.last_since_revision().is_empty());
    let cut = p.begin_list(&ListFilter::default()).unwrap().unwrap();
    assert_eq!((cut.machines.len(), cut.revision.len()), (2, 0));
    let bad = p.begin_list(&ListFilter::default()).unwrap().unwrap();
    assert_eq!(bad.machines.len(), all);
    assert!(bad.machines.iter().all(|m| m.price_per_hour < 0.0));
    assert!(bad.revision.is_empty());
    assert!(p.begin_list(&ListFilter::default()).unwrap().is_none());
    assert_eq!(p.list_calls(), 6);

    p.script_lists([ListFault::Unavailable; 3]);
    p.clear_list_script();
    assert_eq!(p.list_script_len(), 0);
    assert!(p.begin_list(&ListFilter::default()).unwrap().is_none());
}
