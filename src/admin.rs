//! `bigfleet admin ...`: the coordinator's admin RPCs (admin certificate under mTLS), the
//! snapshot download, and the offline snapshot restore.

use std::path::Path;

use serde::{Deserialize, Serialize};
use svc_coordinator::SnapshotArchive;

use crate::Context;
use crate::error::CliError;

/// What an admin command did, for `-o json` and the one-line human summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminOutcome {
    pub action: String,
    pub message: String,
}

impl AdminOutcome {
    fn new(action: &str, message: String) -> Self {
        Self {
            action: action.to_owned(),
            message,
        }
    }
}

pub async fn assign_domain(
    ctx: &Context,
    key: &str,
    value: &str,
    shard: &str,
) -> Result<AdminOutcome, CliError> {
    ctx.on_coordinator(async |c| c.assign_domain(key, value, shard).await)
        .await?;
    Ok(AdminOutcome::new(
        "assign-domain",
        format!("domain {key}={value} assigned to shard {shard}"),
    ))
}

pub async fn unassign_domain(
    ctx: &Context,
    key: &str,
    value: &str,
) -> Result<AdminOutcome, CliError> {
    ctx.on_coordinator(async |c| c.unassign_domain(key, value).await)
        .await?;
    Ok(AdminOutcome::new(
        "unassign-domain",
        format!("domain {key}={value} is not assigned to any shard"),
    ))
}

pub async fn remove_shard(ctx: &Context, shard: &str) -> Result<AdminOutcome, CliError> {
    ctx.on_coordinator(async |c| c.remove_shard(shard).await)
        .await?;
    Ok(AdminOutcome::new(
        "remove-shard",
        format!("shard {shard} removed with its cluster and domain bindings"),
    ))
}

/// Downloads the leader's snapshot (no timeout: it may be large) and writes it in the file
/// layout `snapshot restore` reads, after checking it is a coordinator snapshot.
pub async fn snapshot_save(ctx: &Context, file: &Path) -> Result<AdminOutcome, CliError> {
    let (meta, state) = ctx
        .coordinator_client(None)?
        .snapshot_save()
        .await
        .map_err(|e| CliError::coordinator(e, None))?;
    let archive =
        SnapshotArchive::from_parts(&meta, state).map_err(|e| CliError::Snapshot(e.to_string()))?;
    let path = file.to_owned();
    let written = archive.clone();
    tokio::task::spawn_blocking(move || written.write_file(&path))
        .await
        .map_err(|e| CliError::Snapshot(e.to_string()))?
        .map_err(|e| CliError::Snapshot(e.to_string()))?;
    let (term, index) = archive
        .meta
        .last_log_id
        .map_or((0, 0), |l| (l.leader_id.term, l.index));
    Ok(AdminOutcome::new(
        "snapshot-save",
        format!(
            "saved the coordinator snapshot at term {term}, index {index} ({} bytes of state) to {}",
            archive.state.len(),
            file.display()
        ),
    ))
}

/// Offline: rebuilds a stopped replica's data directory from a snapshot file or export.
pub async fn snapshot_restore(
    data_dir: &Path,
    node_id: &str,
    raft_advertise: &str,
    file: &Path,
) -> Result<AdminOutcome, CliError> {
    let (d, n, r, f) = (
        data_dir.to_owned(),
        node_id.to_owned(),
        raft_advertise.to_owned(),
        file.to_owned(),
    );
    let report =
        tokio::task::spawn_blocking(move || svc_coordinator::restore_snapshot(&d, &n, &r, &f))
            .await
            .map_err(|e| CliError::Snapshot(e.to_string()))?
            .map_err(|e| CliError::Snapshot(e.to_string()))?;
    Ok(AdminOutcome::new(
        "snapshot-restore",
        format!(
            "restored {} (term {}, index {}: {} shards, {} domains) into {} as a single-voter cluster of {node_id}; start this replica first, then the others with empty data directories",
            file.display(),
            report.term,
            report.index,
            report.shards,
            report.domains,
            data_dir.display()
        ),
    ))
}
