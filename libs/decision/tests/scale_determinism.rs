//! Byte-identical output across thread counts on fleets large enough to take
//! the engine's parallel paths (chunked snapshot pass, parallel sorts, victim
//! scoring), and the fleet fast path equal to the machine-slice path.

use bigfleet_decision::synth;
use bigfleet_decision::{CycleOptions, run_cycle};

fn check(s: &synth::Scenario) {
    let fleet = s.fleet().unwrap();
    let opts = |threads| CycleOptions {
        threads,
        verdicts: true,
        claims: true,
        ..CycleOptions::default()
    };
    let base = run_cycle(&s.fleet_input(&fleet), &opts(1)).unwrap();
    assert!(!base.actions.is_empty() || !base.claims.is_empty());
    for t in [2, 4] {
        let out = run_cycle(&s.fleet_input(&fleet), &opts(t)).unwrap();
        assert_eq!(out, base, "{} threads={t}", s.name);
    }
    let mut sliced = run_cycle(&s.input(), &opts(2)).unwrap();
    let mut b = base;
    sliced.stats.snapshot_bytes = 0;
    b.stats.snapshot_bytes = 0;
    assert_eq!(sliced, b, "{}: slice path", s.name);
}

#[test]
fn aggregated_large_fleet_is_thread_count_independent() {
    check(&synth::aggregated(140_000, 10, 8, 7));
}

#[test]
fn reprovision_large_fleet_is_thread_count_independent() {
    check(&synth::reprovision(100_000, 8, 8, 9));
}

#[test]
fn realistic_fleet_is_thread_count_independent() {
    let mut s = synth::realistic("r", 6, 60, 60_000, 20_000, 11);
    synth::settle(&mut s, 3);
    synth::churn(&mut s, 0.05, 5);
    check(&s);
}
