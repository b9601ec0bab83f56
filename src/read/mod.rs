//! Read commands: `shards`, `needs`, `shortfalls`, `domains`, `transfers`, `actions`,
//! `machines`.
//!
//! With `--inspect` they read through svc-inspect (one call, its cache); without it the CLI
//! does the same fan-out itself — the coordinator's `ListShards`, then every shard's read
//! services — using svc-inspect's library, so both paths show the same data.

mod actions;
mod machines;
mod needs;
mod placement;
mod shards;

pub use actions::{Actions, SeenActions, actions, print_actions};
pub use machines::{MachinesOutput, machines, parse_machine_state};
pub use needs::{NeedsOutput, needs, needs_warnings};
pub use placement::{Domains, Shortfalls, Transfers, domains, shortfalls, transfers};
pub use shards::{ShardsOutput, shard_warnings, shards};

use std::sync::Arc;

use bigfleet_mesh::MeshChannel;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_client::InspectClient;
use svc_inspect::InspectError;
use svc_inspect::fleet::{Fleet, FleetOverview};
use tonic::Status;

use crate::Context;
use crate::error::{CliError, RemoteError};

/// Awaits one svc-inspect call under the context's timeout; its failure, or the timeout,
/// becomes an error naming `rpc` at `addr`.
async fn inspect_call<T>(
    ctx: &Context,
    addr: &str,
    rpc: &'static str,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, CliError> {
    let status = match tokio::time::timeout(ctx.timeout, call).await {
        Ok(Ok(r)) => return Ok(r),
        Ok(Err(s)) => s,
        Err(_) => Status::deadline_exceeded("timed out"),
    };
    Err(CliError::Remote(Box::new(RemoteError {
        service: "inspect",
        addr: addr.to_owned(),
        rpc,
        roles: "readonly or admin",
        status,
        timeout: Some(ctx.timeout),
    })))
}

fn fleet_error(ctx: &Context, e: InspectError) -> CliError {
    match e {
        InspectError::NoShardsKnown(c) | InspectError::Coordinator(c) => {
            CliError::coordinator(c, Some(ctx.timeout))
        }
        InspectError::AllShardsUnreachable(m) => CliError::NoShardReachable(m),
        other => CliError::NoShardReachable(other.to_string()),
    }
}

/// `rpc` on svc-inspect's `Inspect` service at `addr`, under the context's timeout.
async fn on_inspect<T>(
    ctx: &Context,
    addr: &str,
    rpc: &'static str,
    call: impl AsyncFnOnce(InspectClient<MeshChannel>) -> Result<tonic::Response<T>, Status>,
) -> Result<T, CliError> {
    let client = InspectClient::new(ctx.inspect_channel(addr)?);
    Ok(inspect_call(ctx, addr, rpc, call(client))
        .await?
        .into_inner())
}

/// A read both paths answer alike: `rpc` through svc-inspect when `--inspect` is set,
/// otherwise `direct` on the CLI's own fan-out.
async fn inspect_or_fleet<T>(
    ctx: &Context,
    rpc: &'static str,
    via_inspect: impl AsyncFnOnce(InspectClient<MeshChannel>) -> Result<tonic::Response<T>, Status>,
    direct: impl AsyncFnOnce(Fleet) -> Result<T, InspectError>,
) -> Result<T, CliError> {
    match &ctx.inspect {
        Some(addr) => on_inspect(ctx, addr, rpc, via_inspect).await,
        None => direct(ctx.fleet()?).await.map_err(|e| fleet_error(ctx, e)),
    }
}

async fn fleet_summary(
    ctx: &Context,
    addr: &str,
    max_shortfalls: u32,
) -> Result<mesh::FleetSummaryResponse, CliError> {
    let req = mesh::FleetSummaryRequest { max_shortfalls };
    on_inspect(ctx, addr, "FleetSummary", async |mut c| {
        c.fleet_summary(req).await
    })
    .await
}

/// The CLI's own fleet overview; a coordinator that could not be asked fails the read.
async fn fleet_overview(ctx: &Context) -> Result<Arc<FleetOverview>, CliError> {
    let o = ctx.fleet()?.overview().await;
    match &o.coordinator_failure {
        Some(e) => Err(CliError::coordinator(e.clone(), Some(ctx.timeout))),
        None => Ok(o),
    }
}

/// A timestamp table cell: RFC 3339 seconds, `-` when unset.
fn timestamp_cell(nanos: i64) -> String {
    svc_inspect_timestamp(nanos).unwrap_or_else(|| "-".to_owned())
}

fn svc_inspect_timestamp(nanos: i64) -> Option<String> {
    (nanos > 0).then(|| {
        let t = std::time::UNIX_EPOCH
            + std::time::Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
        humantime::format_rfc3339_seconds(t).to_string()
    })
}

/// Warnings for shards a fan-out could not ask: their records are missing, not empty.
fn unreachable_warnings(what: &str, unreachable: &[mesh::ShardError]) -> Vec<String> {
    unreachable
        .iter()
        .map(|s| {
            format!(
                "shard {} did not answer ({}); its {what} are missing",
                s.shard_id, s.error
            )
        })
        .collect()
}

/// A compact duration for tables: `850ms`, `4.2s`, `3m12s`, `5h4m`, `3d2h`.
pub fn short_duration(nanos: i64) -> String {
    let nanos = nanos.max(0);
    let ms = nanos / 1_000_000;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = nanos / 1_000_000_000;
    if secs < 60 {
        return format!("{}.{}s", secs, (ms % 1000) / 100);
    }
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if h == 0 {
        format!("{m}m{}s", secs % 60)
    } else if d == 0 {
        format!("{h}h{}m", m % 60)
    } else {
        format!("{d}d{}h", h % 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_durations_keep_two_units() {
        assert_eq!(short_duration(-5), "0ms");
        assert_eq!(short_duration(850_000_000), "850ms");
        assert_eq!(short_duration(4_250_000_000), "4.2s");
        assert_eq!(short_duration(192 * 1_000_000_000), "3m12s");
        assert_eq!(
            short_duration((5 * 3600 + 4 * 60 + 59) * 1_000_000_000),
            "5h4m"
        );
        assert_eq!(
            short_duration((3 * 86_400 + 2 * 3600 + 30) * 1_000_000_000),
            "3d2h"
        );
    }
}
