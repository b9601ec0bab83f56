//! Against a real etcd (started per test by `testing::EtcdServer`): epochs, the leader
//! lease and its gate, and work-endpoint discovery.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bigfleet_shardlease::testing::EtcdServer;
use bigfleet_shardlease::{Campaign, EtcdConfig, EtcdShards, LeaderGate, ShardLeaseError, Term};
use bigfleet_testkit::wait_until;

/// A fresh etcd for one test (with test logging on), or `None` when etcd is not installed
/// and the test skips.
async fn etcd_or_skip() -> Option<EtcdServer> {
    init_tracing();
    EtcdServer::start_or_skip().await
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "bigfleet_shardlease=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

async fn shards(endpoints: Vec<String>, ttl_secs: u64) -> EtcdShards {
    let mut cfg = EtcdConfig::new(endpoints);
    cfg.lease_ttl = Duration::from_secs(ttl_secs);
    EtcdShards::connect(cfg).await.expect("connect")
}

/// Waits for a term on `gate`, failing the test after `within`.
async fn term_within(gate: &LeaderGate, within: Duration) -> Term {
    let mut rx = gate.terms();
    let t = tokio::time::timeout(within, rx.wait_for(Option::is_some))
        .await
        .unwrap_or_else(|_| panic!("no term within {within:?}"))
        .expect("gate alive");
    t.expect("some term")
}

async fn not_actuating_within(gate: &LeaderGate, within: Duration) {
    let mut rx = gate.is_actuating();
    tokio::time::timeout(within, rx.wait_for(|a| !*a))
        .await
        .unwrap_or_else(|_| panic!("still actuating after {within:?}"))
        .expect("gate alive");
}

#[tokio::test]
async fn epoch_strictly_increases_across_50_restarts() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let mut last = 0;
    for i in 0..50 {
        // A fresh connection and campaign per "process start".
        let s = shards(etcd.endpoints(), 2).await;
        let gate = s.campaign(Campaign::new("shard-r"));
        let term = term_within(&gate, Duration::from_secs(5)).await;
        assert!(
            term.epoch > last,
            "restart {i}: epoch {} after {last}",
            term.epoch
        );
        last = term.epoch;
        assert!(*gate.is_actuating().borrow());
        gate.resign().await;
    }
    assert_eq!(last, 50, "one epoch per term, none skipped or reused");
    let s = shards(etcd.endpoints(), 2).await;
    assert_eq!(s.current_epoch("shard-r").await.unwrap(), 50);
    // Another shard's counter is independent.
    assert_eq!(s.next_epoch("shard-other", 0).await.unwrap().epoch, 1);
}

#[tokio::test]
async fn racing_starts_never_share_an_epoch() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    // Eight "processes" (own connections) mint at once, three times each.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let endpoints = etcd.endpoints();
        tasks.push(tokio::spawn(async move {
            let s = shards(endpoints, 2).await;
            let mut grants = Vec::new();
            for _ in 0..3 {
                grants.push(s.next_epoch("shard-race", 0).await.expect("mint"));
            }
            grants
        }));
    }
    let mut grants = Vec::new();
    for t in tasks {
        let mine = t.await.unwrap();
        // Within one process every mint is above its previous one.
        assert!(mine.windows(2).all(|w| w[0].epoch < w[1].epoch));
        grants.extend(mine);
    }
    let epochs: BTreeSet<u64> = grants.iter().map(|g| g.epoch).collect();
    assert_eq!(epochs.len(), 24, "duplicate epochs: {grants:?}");
    assert_eq!(
        epochs,
        (1..=24).collect(),
        "dense: each committed mint is +1"
    );
    // In commit order (etcd revision) the epochs strictly increase.
    grants.sort_by_key(|g| g.revision);
    assert!(
        grants.windows(2).all(|w| w[0].epoch < w[1].epoch),
        "{grants:?}"
    );
}

#[tokio::test]
async fn racing_campaigners_elect_exactly_one() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let mut gates = Vec::new();
    for _ in 0..8 {
        let s = shards(etcd.endpoints(), 2).await;
        gates.push(s.campaign(Campaign::new("shard-c")));
    }
    wait_until(Duration::from_secs(5), "a winner", async || {
        gates.iter().any(|g| g.current().is_some())
    })
    .await;
    // Give any second winner time to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leaders: Vec<Term> = gates.iter().filter_map(LeaderGate::current).collect();
    assert_eq!(leaders.len(), 1, "{leaders:?}");
    assert_eq!(leaders[0].epoch, 1, "losing campaigners mint nothing");
}

#[tokio::test]
async fn floor_and_corrupt_epoch() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let s = shards(etcd.endpoints(), 2).await;
    assert_eq!(s.next_epoch("shard-f", 41).await.unwrap().epoch, 42);
    assert_eq!(s.next_epoch("shard-f", 0).await.unwrap().epoch, 43);
    let mut c = s.client();
    c.put("/bigfleet/shards/shard-f/epoch", "4x", None)
        .await
        .unwrap();
    match s.next_epoch("shard-f", 0).await {
        Err(ShardLeaseError::CorruptEpoch { key, value }) => {
            assert_eq!(key, "/bigfleet/shards/shard-f/epoch");
            assert_eq!(value, "4x");
        }
        other => panic!("expected a corrupt-epoch error, got {other:?}"),
    }
    // A campaign on a corrupt epoch never actuates.
    let gate = s.campaign(Campaign::new("shard-f"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(gate.current(), None);
}

#[tokio::test]
async fn standby_takes_over_within_ttl_plus_2s_with_a_higher_epoch() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let ttl = 2;
    let a = shards(etcd.endpoints(), ttl)
        .await
        .campaign(Campaign::new("shard-fo").with_holder("a"));
    let first = term_within(&a, Duration::from_secs(5)).await;
    let b = shards(etcd.endpoints(), ttl)
        .await
        .campaign(Campaign::new("shard-fo").with_holder("b"));
    // The standby stays a standby while the leader keeps its lease (> one TTL).
    tokio::time::sleep(Duration::from_secs(ttl + 1)).await;
    assert_eq!(b.current(), None);
    assert_eq!(a.current(), Some(first));

    // The leader dies without releasing anything.
    let killed = Instant::now();
    drop(a);
    let second = term_within(&b, Duration::from_secs(ttl + 2)).await;
    let took = killed.elapsed();
    assert_eq!(*b.epochs().borrow(), Some(second.epoch));
    assert!(second.epoch > first.epoch, "{second:?} after {first:?}");
    assert!(
        took <= Duration::from_secs(ttl + 2),
        "takeover took {took:?}"
    );
    eprintln!("takeover after {took:?}");
}

#[tokio::test]
async fn resign_hands_over_at_once() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let a = shards(etcd.endpoints(), 10)
        .await
        .campaign(Campaign::new("shard-rs"));
    let first = term_within(&a, Duration::from_secs(5)).await;
    let b = shards(etcd.endpoints(), 10)
        .await
        .campaign(Campaign::new("shard-rs"));
    let t0 = Instant::now();
    a.resign().await;
    // Far below the 10 s TTL: the revoke deleted the key and woke the standby's watch.
    let second = term_within(&b, Duration::from_secs(3)).await;
    assert!(second.epoch > first.epoch);
    eprintln!("handover after {:?}", t0.elapsed());
}

#[tokio::test]
async fn etcd_frozen_longer_than_the_ttl_pauses_then_resumes_with_a_higher_epoch() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let ttl = 2;
    let s = shards(etcd.endpoints(), ttl).await;
    let margin = s.timing().safety_margin;
    // The epochs go into a channel that existed before the campaign (decide's shape).
    let (tx, epochs) = tokio::sync::watch::channel(Some(999));
    let gate = s.campaign_with(Campaign::new("shard-p"), tx);
    assert_eq!(*epochs.borrow(), None, "cleared at once");
    let first = term_within(&gate, Duration::from_secs(5)).await;
    assert_eq!(*epochs.borrow(), Some(first.epoch));
    // Let a keep-alive or two go through so the test starts mid-term.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(gate.current(), Some(first));

    let paused = Instant::now();
    etcd.pause();
    // The proof runs out at (last keep-alive sent) + ttl - margin, i.e. before etcd
    // itself would expire the lease.
    not_actuating_within(&gate, Duration::from_secs(ttl)).await;
    let flipped = paused.elapsed();
    assert_eq!(gate.current(), None);
    assert_eq!(*epochs.borrow(), None);
    assert!(
        flipped <= Duration::from_secs(ttl) - margin + Duration::from_millis(300),
        "flipped after {flipped:?}"
    );
    // Still frozen past the TTL: no term comes back while etcd cannot confirm one.
    tokio::time::sleep(
        Duration::from_secs(ttl) + Duration::from_millis(500)
            - flipped.min(Duration::from_secs(ttl)),
    )
    .await;
    assert_eq!(gate.current(), None);
    etcd.resume();

    let second = term_within(&gate, Duration::from_secs(ttl + 3)).await;
    assert!(second.epoch > first.epoch, "{second:?} after {first:?}");
    assert_ne!(second.lease_id, first.lease_id);
    assert_eq!(*epochs.borrow(), Some(second.epoch));
    eprintln!(
        "flipped after {flipped:?}; resumed with epoch {}",
        second.epoch
    );
}

#[tokio::test]
async fn etcd_killed_and_restarted_resumes_with_a_higher_epoch() {
    let Some(mut etcd) = etcd_or_skip().await else {
        return;
    };
    let ttl = 2;
    let gate = shards(etcd.endpoints(), ttl)
        .await
        .campaign(Campaign::new("shard-k"));
    let first = term_within(&gate, Duration::from_secs(5)).await;
    etcd.kill(0);
    not_actuating_within(&gate, Duration::from_secs(ttl)).await;
    tokio::time::sleep(Duration::from_secs(ttl)).await;
    assert_eq!(gate.current(), None);
    etcd.restart(0).await;
    // The restarted etcd revives the old lease for a full TTL; the holder revokes it
    // rather than waiting, and wins a new term.
    let second = term_within(&gate, Duration::from_secs(ttl + 3)).await;
    assert!(second.epoch > first.epoch);
}

#[tokio::test]
async fn a_short_blip_changes_nothing() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let s = shards(etcd.endpoints(), 3).await;
    let gate = s.campaign(Campaign::new("shard-b"));
    let first = term_within(&gate, Duration::from_secs(5)).await;
    let mut actuating = gate.is_actuating();
    let mut terms = gate.terms();
    actuating.borrow_and_update();
    terms.borrow_and_update();

    etcd.pause();
    tokio::time::sleep(Duration::from_millis(700)).await;
    etcd.resume();
    // Well past the point a missed keep-alive would have mattered.
    tokio::time::sleep(Duration::from_secs(2)).await;

    assert!(!actuating.has_changed().unwrap(), "the gate flickered");
    assert!(!terms.has_changed().unwrap(), "the term changed");
    assert_eq!(gate.current(), Some(first));
    assert_eq!(s.current_epoch("shard-b").await.unwrap(), first.epoch);
}

#[tokio::test]
async fn work_endpoint_watcher_follows_a_failover() {
    let Some(etcd) = etcd_or_skip().await else {
        return;
    };
    let ttl = 2;
    let watcher = shards(etcd.endpoints(), ttl)
        .await
        .watch_work_endpoint("shard-w");
    // Nothing published yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(watcher.current(), None);

    let a = shards(etcd.endpoints(), ttl)
        .await
        .campaign(Campaign::new("shard-w").with_work_endpoint("https://a.example:7782"));
    term_within(&a, Duration::from_secs(5)).await;
    let b = shards(etcd.endpoints(), ttl)
        .await
        .campaign(Campaign::new("shard-w").with_work_endpoint("unix:///run/b/decide.sock"));
    assert_eq!(
        watcher
            .wait_for_endpoint(Duration::from_secs(2))
            .await
            .as_deref(),
        Some("https://a.example:7782")
    );

    let mut rx = watcher.subscribe();
    drop(a);
    let t0 = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(ttl + 2),
        rx.wait_for(|e| e.as_deref() == Some("unix:///run/b/decide.sock")),
    )
    .await
    .expect("watcher followed the failover")
    .unwrap();
    // The watcher may see the endpoint a moment before b's task reports its term.
    let tb = term_within(&b, Duration::from_secs(1)).await;
    assert!(tb.epoch >= 2);
    eprintln!("watcher followed after {:?}", t0.elapsed());

    // A watcher started now sees the current value straight away.
    let late = shards(etcd.endpoints(), ttl)
        .await
        .watch_work_endpoint("shard-w");
    assert_eq!(
        late.wait_for_endpoint(Duration::from_secs(2))
            .await
            .as_deref(),
        Some("unix:///run/b/decide.sock")
    );
    // Resigning removes the endpoint with the lease.
    b.resign().await;
    tokio::time::timeout(Duration::from_secs(2), rx.wait_for(Option::is_none))
        .await
        .expect("endpoint withdrawn")
        .unwrap();
}

#[tokio::test]
async fn epochs_survive_an_etcd_leader_change() {
    init_tracing();
    let Some(mut etcd) = EtcdServer::cluster_or_skip(3).await else {
        return;
    };
    let all = shards(etcd.endpoints(), 2).await;
    let mut last = 0;
    for _ in 0..5 {
        last = all.next_epoch("shard-l", 0).await.unwrap().epoch;
    }
    assert_eq!(last, 5);

    // Find and kill the etcd leader.
    let mut c = all.client();
    let status = c.status().await.unwrap();
    let leader_id = status.leader();
    let mut leader_idx = None;
    for i in 0..3 {
        let mut m = etcd_client::Client::connect([etcd.endpoint(i)], None)
            .await
            .unwrap();
        let st = m.status().await.unwrap();
        if st.header().map(|h| h.member_id()) == Some(leader_id) {
            leader_idx = Some(i);
        }
    }
    let leader_idx = leader_idx.expect("found the etcd leader");
    etcd.kill(leader_idx);
    let survivors: Vec<String> = (0..3)
        .filter(|&i| i != leader_idx)
        .map(|i| etcd.endpoint(i))
        .collect();
    let s = shards(survivors, 2).await;
    // The survivors elect a new leader; minting continues strictly above.
    let grant = wait_until(
        Duration::from_secs(10),
        "an epoch after the leader change",
        async || s.next_epoch("shard-l", 0).await,
    )
    .await;
    assert_eq!(grant.epoch, last + 1);
    let gate = s.campaign(Campaign::new("shard-l"));
    let term = term_within(&gate, Duration::from_secs(5)).await;
    assert_eq!(term.epoch, last + 2);
}
