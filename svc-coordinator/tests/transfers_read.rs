//! The internal `bigfleet.mesh.v1.CoordinatorInfo/ListTransfers` read (ADR-0139): what it
//! shows while a transfer runs and after it finishes (against the real binary, fed by two
//! fake shards), and who may call it under mTLS (against an in-process replica).

use crate::common;

use std::time::Duration;

use bigfleet_proto::mesh::v1::coordinator_info_client::CoordinatorInfoClient;
use bigfleet_proto::mesh::v1::{self as mpb};
use bigfleet_proto::v1alpha1::{self as pb};
use bigfleet_testkit::{TlsPaths, wait_until};
use common::*;
use tonic::Code;
use tonic::transport::Channel;

const WITHIN: Duration = Duration::from_secs(30);

async fn info_client(addr: &str) -> CoordinatorInfoClient<Channel> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    CoordinatorInfoClient::new(ch)
}

async fn transfers(
    c: &mut CoordinatorInfoClient<Channel>,
    shard: &str,
) -> mpb::ListTransfersResponse {
    c.list_transfers(mpb::ListTransfersRequest {
        shard_id: shard.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_follows_a_transfer_from_release_to_done() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::new(dir.path(), "coord-0");
    r.extra = eager_rebalancing();
    r.extra
        .extend(["--rebalance-max-machines".to_owned(), "2".to_owned()]);
    r.spawn("");
    wait_leader(std::slice::from_mut(&mut r), WITHIN).await;
    let mut c = client(&r.api_addr()).await.expect("connect");
    let mut info = info_client(&r.api_addr()).await;

    // Short of nothing until ownership has been read: with a shortfall from the start, the
    // 200 ms rebalancer may begin a transfer before that first read.
    let mut recipient = FakeShard::new("s0");
    let mut donor = FakeShard::with_idle_gpus("s1", &["m1", "m2", "m3"]);
    donor.answering = false;
    recipient.report(&mut c).await.unwrap();
    donor.report(&mut c).await.unwrap();
    c.assign_domain(assign("zone", "z1", "s1")).await.unwrap();

    // Nothing has started yet; ownership is there.
    let got = transfers(&mut info, "").await;
    assert!(got.active.is_empty() && got.recent.is_empty(), "{got:?}");
    let owned: Vec<(&str, Vec<(&str, &str)>)> = got
        .shards
        .iter()
        .map(|s| {
            (
                s.shard_id.as_str(),
                s.domains
                    .iter()
                    .map(|d| (d.topology_key.as_str(), d.topology_value.as_str()))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(owned, vec![("s0", vec![]), ("s1", vec![("zone", "z1")])]);

    // The rebalancer starts a transfer; the donor holds its ack, so it stays in release.
    recipient.shortfalls = vec![gpu_shortfall(); 2];
    wait_until(WITHIN, "a release instruction", async || {
        recipient.report(&mut c).await.unwrap();
        donor.report(&mut c).await.unwrap();
        if donor.transfers().is_empty() {
            Err(r.log_tail())
        } else {
            Ok(())
        }
    })
    .await;
    let (release_id, _, _) = donor.transfers()[0].clone();
    let got = transfers(&mut info, "").await;
    assert_eq!(got.active.len(), 1, "{got:?}");
    let t = &got.active[0];
    assert_eq!(
        (
            t.kind.as_str(),
            t.phase.as_str(),
            t.donor_shard_id.as_str(),
            t.recipient_shard_id.as_str(),
            t.instance_type.as_str(),
            t.count,
            t.pending_instruction_id.as_str(),
            t.pending_shard_id.as_str(),
        ),
        (
            "idle",
            "release",
            "s1",
            "s0",
            "gpu",
            2,
            release_id.as_str(),
            "s1"
        )
    );
    assert!(t.started_at_unix_ns > 0 && t.updated_at_unix_ns >= t.started_at_unix_ns);
    let pending = |resp: &mpb::ListTransfersResponse, shard: &str| {
        resp.shards
            .iter()
            .find(|s| s.shard_id == shard)
            .map(|s| s.pending_instruction_ids.clone())
            .unwrap_or_default()
    };
    // The domain assignment (which this fake shard never acknowledges) first, then the
    // transfer's release.
    let s1_pending = pending(&got, "s1");
    assert_eq!(s1_pending.len(), 2, "{s1_pending:?}");
    assert_eq!(s1_pending[1], release_id);
    assert!(pending(&got, "s0").is_empty());

    // The donor answers, the recipient adopts: the transfer finishes into `recent`.
    donor.answering = true;
    let done = wait_until(WITHIN, "the transfer to finish", async || {
        donor.report(&mut c).await.unwrap();
        recipient.report(&mut c).await.unwrap();
        let got = transfers(&mut info, "").await;
        if got.active.is_empty() && !got.recent.is_empty() {
            Ok(got)
        } else {
            Err(format!("{got:?}\n{}", r.log_tail()))
        }
    })
    .await;
    let t = &done.recent[0];
    assert_eq!(
        (
            t.phase.as_str(),
            t.moved,
            t.machine_ids.clone(),
            t.pending_instruction_id.as_str()
        ),
        ("done", 2, vec!["m1".to_owned(), "m2".to_owned()], "")
    );
    assert_eq!(pending(&done, "s1"), s1_pending[..1]);
    assert!(pending(&done, "s0").is_empty());

    // The shard filter keeps transfers either end of which is the shard.
    let only_s0 = transfers(&mut info, "s0").await;
    assert_eq!(
        (only_s0.recent.len(), only_s0.shards.len()),
        (1, 1),
        "{only_s0:?}"
    );
    let stranger = transfers(&mut info, "s9").await;
    assert!(stranger.recent.is_empty() && stranger.shards.is_empty());
}

async fn connect_tls(solo: &MtlsSolo, p: &TlsPaths) -> CoordinatorInfoClient<Channel> {
    CoordinatorInfoClient::new(solo.channel(p).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_and_admin_may_read_transfers_and_nobody_else() {
    let solo = MtlsSolo::start().await;
    let mut got = Vec::new();
    for role in [
        "readonly",
        "admin",
        "shard/s1",
        "cluster/c1",
        "coordinator/solo",
    ] {
        let mut c = connect_tls(&solo, &solo.role(role)).await;
        got.push((
            role,
            code(c.list_transfers(mpb::ListTransfersRequest::default()).await),
        ));
    }
    use Code::{Ok as OK, PermissionDenied as PD};
    assert_eq!(
        got,
        vec![
            ("readonly", OK),
            ("admin", OK),
            ("shard/s1", PD),
            ("cluster/c1", PD),
            ("coordinator/solo", PD),
        ]
    );
    // The shard registered by reporting shows up for a reader, with no domains.
    let ch = solo.channel(&solo.role("shard/s1")).await;
    bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient::new(ch)
        .report_shard(pb::ShardReport {
            shard_id: "s1".into(),
            cycle: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let resp = connect_tls(&solo, &solo.role("readonly"))
        .await
        .list_transfers(mpb::ListTransfersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.shards
            .iter()
            .map(|s| s.shard_id.as_str())
            .collect::<Vec<_>>(),
        ["s1"]
    );
    solo.running.shutdown().await.unwrap();
}
