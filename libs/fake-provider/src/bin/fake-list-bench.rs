//! `fake-list-bench`: seeds a generated fleet, serves it over a Unix socket and times, from
//! a real tonic client, a full List and a delta List after `--change-fraction` of the
//! machines changed. Prints one JSON line. Build with `--release`.
//!
//! Three views of the full List: `full_list_ms` (request to decoded `MachineList`, what a
//! shard's reconcile pays), `full_list_raw_ms` (request to the last byte received, no
//! protobuf decoding), `server_encode_ms` (the provider selecting and encoding the
//! answer in-process, no transport) and `client_decode_ms` (prost decoding that answer
//! in-process, no transport).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bigfleet_fake_provider::server::channel;
use bigfleet_fake_provider::{FakeProvider, connect, spawn_uds};
use bigfleet_proto::v1alpha1::{ConfigureRequest, DrainRequest, ListFilter, MachineState};
use bytes::Buf;
use clap::Parser;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

#[derive(Debug, Parser)]
#[command(name = "fake-list-bench")]
struct Args {
    #[arg(long, default_value_t = 500_000)]
    machines: u64,
    #[arg(long, default_value_t = 20)]
    runs: usize,
    #[arg(long, default_value_t = 0.01)]
    change_fraction: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn summary(mut v: Vec<Duration>) -> serde_json::Value {
    v.sort();
    let pick = |q: f64| {
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        ms(v[i])
    };
    serde_json::json!({ "p50": pick(0.50), "p99": pick(0.99), "min": ms(v[0]), "max": ms(v[v.len() - 1]) })
}

/// Receives a List answer as raw bytes: the transport cost without protobuf decoding.
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = ListFilter;
    type Decode = usize;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = ListFilter;
    type Error = tonic::Status;
    fn encode(&mut self, item: ListFilter, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl Decoder for RawDecoder {
    type Item = usize;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<usize>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(n))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.runs > 0, "--runs must be positive");

    let t = Instant::now();
    let provider = Arc::new(FakeProvider::generate(args.machines, args.seed));
    let seed_ms = ms(t.elapsed());

    let sock = std::env::temp_dir().join(format!("fake-list-bench-{}.sock", std::process::id()));
    let server = spawn_uds(&sock, provider.clone()).await?;
    let target = server.target();
    let mut client = connect(&target).await?;
    let mut raw = tonic::client::Grpc::new(channel(&target).await?)
        .max_decoding_message_size(bigfleet_fake_provider::MAX_MESSAGE_SIZE);

    // Warm up connection, allocator and page cache.
    let warm = client.list(ListFilter::default()).await?.into_inner();
    anyhow::ensure!(
        warm.machines.len() as u64 == args.machines,
        "warm-up list is short"
    );

    let mut encode_times = Vec::with_capacity(args.runs);
    let mut decode_times = Vec::with_capacity(args.runs);
    let mut bytes = 0usize;
    for _ in 0..args.runs {
        let mut buf = Vec::new();
        let t = Instant::now();
        provider.encode_list(&ListFilter::default(), &mut buf);
        encode_times.push(t.elapsed());
        bytes = buf.len();
        let t = Instant::now();
        let decoded = bigfleet_proto::v1alpha1::MachineList::decode(buf.as_slice())?;
        decode_times.push(t.elapsed());
        anyhow::ensure!(
            decoded.machines.len() as u64 == args.machines,
            "decode is short"
        );
    }

    let mut full = Vec::with_capacity(args.runs);
    let mut full_raw = Vec::with_capacity(args.runs);
    let mut cursor = Vec::new();
    for _ in 0..args.runs {
        let t = Instant::now();
        let list = client.list(ListFilter::default()).await?.into_inner();
        full.push(t.elapsed());
        anyhow::ensure!(
            list.machines.len() as u64 == args.machines,
            "full list is short"
        );
        cursor = list.revision;

        raw.ready().await.context("raw client not ready")?;
        let t = Instant::now();
        let path = http::uri::PathAndQuery::from_static("/bigfleet.v1alpha1.CapacityProvider/List");
        let n = raw
            .unary(tonic::Request::new(ListFilter::default()), path, RawCodec)
            .await?
            .into_inner();
        full_raw.push(t.elapsed());
        anyhow::ensure!(n == bytes, "raw list size {n} != encoded size {bytes}");
    }

    // Delta: flip the same `k` idle machines Configured / Idle each run (each flip is
    // two mutations per machine: to the transitional state and on to the target).
    let k = ((args.machines as f64) * args.change_fraction).round() as usize;
    let flip: Vec<String> = provider
        .ids_in_state(MachineState::Idle)
        .into_iter()
        .take(k)
        .collect();
    anyhow::ensure!(
        flip.len() == k,
        "only {} idle machines to change, need {k}",
        flip.len()
    );
    let metadata: BTreeMap<String, String> = BTreeMap::from([
        ("bigfleet.lucy.sh/assigned-priority".into(), "100".into()),
        (
            "bigfleet.lucy.sh/assigned-need-fingerprint".into(),
            "fp-bench".into(),
        ),
    ]);
    let mut delta = Vec::with_capacity(args.runs);
    for run in 0..args.runs {
        for id in &flip {
            if run % 2 == 0 {
                provider.configure(&ConfigureRequest {
                    machine_id: id.clone(),
                    cluster_id: "bench-cluster".into(),
                    shard_metadata: metadata.clone(),
                    ..Default::default()
                })?;
            } else {
                provider.drain(&DrainRequest {
                    machine_id: id.clone(),
                    ..Default::default()
                })?;
            }
        }
        let t = Instant::now();
        let list = client
            .list(ListFilter {
                since_revision: cursor.clone(),
                ..ListFilter::default()
            })
            .await?
            .into_inner();
        delta.push(t.elapsed());
        anyhow::ensure!(
            list.machines.len() == k,
            "delta list returned {} machines, expected {k}",
            list.machines.len()
        );
        cursor = list.revision;
    }
    server.shutdown().await;
    let _ = std::fs::remove_file(&sock);

    println!(
        "{}",
        serde_json::json!({
            "bench": "fake-list-bench",
            "transport": "uds",
            "machines": args.machines,
            "runs": args.runs,
            "seed": args.seed,
            "seed_ms": seed_ms,
            "list_bytes": bytes,
            "full_list_ms": summary(full),
            "full_list_raw_ms": summary(full_raw),
            "server_encode_ms": summary(encode_times),
            "client_decode_ms": summary(decode_times),
            "delta_changed": k,
            "delta_list_ms": summary(delta),
        })
    );
    Ok(())
}
