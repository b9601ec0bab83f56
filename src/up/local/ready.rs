//! Waiting for children to answer `/readyz`, failing early with the log tail of one that
//! exits and, at the deadline, with why each one is still not ready.

use std::time::Duration;

use bigfleet_mesh::poll_until;

use super::children::{CRASH_TAIL_LINES, Crash};
use super::{Mesh, UpError};
use crate::up::probe;

impl Mesh {
    /// Waits until every listed child answers `/readyz` 200; fails early when one exits.
    pub(super) async fn wait_ready(&mut self, idx: &[usize]) -> Result<(), UpError> {
        let mut pending: Vec<usize> = idx.to_vec();
        let every = Duration::from_millis(100);
        let ready = poll_until(self.spec.ready_timeout, every, async || {
            for &i in &pending {
                let c = &mut self.children[i];
                if let Some(status) = c.proc.try_exited() {
                    c.supervised = false;
                    return Err(UpError::ChildFailed(Box::new(Crash {
                        name: c.proc.name().to_owned(),
                        status: Some(status),
                        log_path: c.proc.log_path().to_owned(),
                        tail: c.proc.log_tail(CRASH_TAIL_LINES),
                    })));
                }
            }
            let mut still = Vec::new();
            for &i in &pending {
                let ready = match self.children[i].ready {
                    None => true,
                    Some(addr) => probe::is_ready(addr).await,
                };
                if !ready {
                    still.push(i);
                }
            }
            pending = still;
            Ok(pending.is_empty().then_some(()))
        })
        .await?;
        if ready.is_some() {
            return Ok(());
        }
        let mut names = Vec::new();
        let mut tails = String::new();
        for &i in &pending {
            let c = &self.children[i];
            let why = match c.ready {
                Some(a) => probe::http_get(a, "/readyz", Duration::from_secs(1))
                    .await
                    .map_or_else(
                        |e| e.to_string(),
                        |(code, b)| format!("{code} {}", b.trim()),
                    ),
                None => String::new(),
            };
            names.push(format!("{} ({why})", c.proc.name()));
            tails.push_str(&format!("--- {} ---\n", c.proc.name()));
            for l in c.proc.log_tail(CRASH_TAIL_LINES) {
                tails.push_str(&format!("  | {l}\n"));
            }
        }
        Err(UpError::NotReady {
            children: names.join(", "),
            timeout: self.spec.ready_timeout,
            tails,
        })
    }
}
