//! The live sessions, one per cluster.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::metrics::{self, GatewayMetrics};
use crate::session::Session;

/// Why a session could not be installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCapacity {
    pub max_sessions: usize,
}

/// Cluster id → its live session. Installing a session for a cluster that already has one
/// replaces it; removal only deletes the entry if it is still the same session, so the
/// cleanup of a replaced session can never evict its replacement.
#[derive(Debug)]
pub struct Registry {
    sessions: Mutex<HashMap<Arc<str>, Arc<Session>>>,
    max_sessions: usize,
    next_id: AtomicU64,
    metrics: GatewayMetrics,
}

impl Registry {
    pub fn new(max_sessions: usize, metrics: GatewayMetrics) -> Self {
        // Seeded from the clock so a restarted gateway's ids are larger than the previous
        // process's: decide orders opens and closes by id.
        let seed = u64::try_from(crate::unix_nanos()).unwrap_or(1).max(1);
        Self {
            sessions: Mutex::new(HashMap::new()),
            max_sessions,
            next_id: AtomicU64::new(seed),
            metrics,
        }
    }

    /// A fresh session id: unique and increasing within this process.
    pub fn next_session_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Installs `session` for its cluster. Returns the session it replaced, which the
    /// caller must end. A new cluster beyond `max_sessions` is refused; replacing an
    /// existing cluster's session is always allowed (the count does not grow).
    pub fn install(&self, session: Arc<Session>) -> Result<Option<Arc<Session>>, AtCapacity> {
        let mut map = self.sessions.lock();
        if !map.contains_key(&session.cluster) && map.len() >= self.max_sessions {
            return Err(AtCapacity {
                max_sessions: self.max_sessions,
            });
        }
        let previous = map.insert(Arc::clone(&session.cluster), session);
        let n = map.len();
        drop(map);
        self.metrics.active_sessions.set(n as i64);
        self.metrics.lifecycle(metrics::INSTALLED);
        if previous.is_some() {
            self.metrics.lifecycle(metrics::REPLACED);
        }
        Ok(previous)
    }

    /// Removes `session` if it is still the cluster's live session; `true` if it was.
    pub fn remove(&self, session: &Session) -> bool {
        let mut map = self.sessions.lock();
        let same = map
            .get(&session.cluster)
            .is_some_and(|live| live.id == session.id);
        if same {
            map.remove(&session.cluster);
        }
        let n = map.len();
        drop(map);
        if same {
            self.metrics.active_sessions.set(n as i64);
            self.metrics.lifecycle(metrics::REMOVED);
        }
        same
    }

    /// The cluster's live session.
    pub fn get(&self, cluster: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(cluster).cloned()
    }

    /// Live sessions.
    pub fn count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Every live session, sorted by cluster id.
    pub fn snapshot(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<_> = self.sessions.lock().values().cloned().collect();
        all.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        all
    }

    /// Ends every session with `status` (drain on shutdown; operators reconnect).
    pub fn end_all(&self, status: &tonic::Status) -> usize {
        let all = self.snapshot();
        for s in &all {
            s.end(crate::session::REASON_SHUTDOWN, Some(status.clone()));
        }
        all.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::RollupRate;

    fn session(reg: &Registry, cluster: &str) -> Arc<Session> {
        Session::new(
            reg.next_session_id(),
            cluster,
            4,
            RollupRate {
                per_second: 0.0,
                burst: 1,
            },
            GatewayMetrics::unregistered(),
        )
    }

    fn lifecycle(m: &GatewayMetrics, event: &str) -> u64 {
        m.session_lifecycle.with_label_values(&[event]).get()
    }

    #[test]
    fn replacement_returns_the_old_session_and_its_cleanup_does_not_evict_the_new() {
        let m = GatewayMetrics::unregistered();
        let reg = Registry::new(10, m.clone());
        let old = session(&reg, "a");
        let new = session(&reg, "a");
        assert!(new.id > old.id, "ids increase");
        assert!(reg.install(Arc::clone(&old)).unwrap().is_none());
        let replaced = reg.install(Arc::clone(&new)).unwrap().unwrap();
        assert_eq!(replaced.id, old.id);
        assert!(
            !reg.remove(&old),
            "the old session's cleanup must not evict the new one"
        );
        assert_eq!(reg.get("a").unwrap().id, new.id);
        assert!(reg.remove(&new));
        assert!(reg.get("a").is_none());
        assert_eq!(lifecycle(&m, "installed"), 2);
        assert_eq!(lifecycle(&m, "replaced"), 1);
        assert_eq!(lifecycle(&m, "removed"), 1);
        assert_eq!(m.active_sessions.get(), 0);
    }

    #[test]
    fn cap_refuses_new_clusters_but_allows_replacement() {
        let reg = Registry::new(2, GatewayMetrics::unregistered());
        reg.install(session(&reg, "a")).unwrap();
        reg.install(session(&reg, "b")).unwrap();
        assert_eq!(
            reg.install(session(&reg, "c")).unwrap_err(),
            AtCapacity { max_sessions: 2 }
        );
        assert!(reg.install(session(&reg, "a")).unwrap().is_some());
        assert_eq!(reg.count(), 2);
        let names: Vec<_> = reg
            .snapshot()
            .iter()
            .map(|s| s.cluster.to_string())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }
}
