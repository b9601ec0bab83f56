//! Whether decide may hand out work right now, and under which fencing epoch.
//!
//! With the epoch file the answer never changes: always, under the process's epoch. With
//! an external leader lease (the binary's etcd mode, libs/shardlease) it follows the
//! lease: `Some(epoch)` while this process holds a term, `None` otherwise. Only the
//! hand-out of work consults it — cycles, sessions, reads and metrics never stop — and
//! every work item is stamped with the epoch read at its hand-out, so an item can never
//! carry an epoch from a term other than the one that allowed it. Core knows nothing about
//! etcd: the source is a plain watch channel.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

/// Where the fencing epoch comes from.
#[derive(Debug, Clone, Default)]
pub enum EpochSource {
    /// [`crate::DecideConfig::epoch`] for the whole process life (the epoch file);
    /// always actuating.
    #[default]
    Fixed,
    /// Leadership terms: `Some(epoch)` while this process may hand out work, each term's
    /// epoch strictly above the previous one's; `None` pauses the hand-out.
    Leased(watch::Receiver<Option<u64>>),
}

/// The hand-out gate built from an [`EpochSource`].
#[derive(Debug)]
pub(crate) struct ActuationGate {
    fixed: u64,
    leased: Option<watch::Receiver<Option<u64>>>,
    /// Highest term epoch seen, for reports between terms.
    latest: AtomicU64,
}

impl ActuationGate {
    pub(crate) fn new(fixed: u64, source: &EpochSource) -> Self {
        Self {
            fixed,
            leased: match source {
                EpochSource::Fixed => None,
                EpochSource::Leased(rx) => Some(rx.clone()),
            },
            latest: AtomicU64::new(fixed),
        }
    }

    /// The epoch to stamp on a hand-out now, or `None`: hand out nothing.
    pub(crate) fn actuating_epoch(&self) -> Option<u64> {
        match &self.leased {
            None => Some(self.fixed),
            Some(rx) => {
                let epoch = *rx.borrow();
                if let Some(e) = epoch {
                    self.latest.fetch_max(e, Ordering::AcqRel);
                }
                epoch
            }
        }
    }

    /// The epoch reports carry: the current term's, else the highest seen, else the
    /// process's own.
    pub(crate) fn reported_epoch(&self) -> u64 {
        self.actuating_epoch()
            .unwrap_or_else(|| self.latest.load(Ordering::Acquire))
    }

    /// A receiver that changes whenever actuation may have (`None` for a fixed epoch,
    /// which never changes). Take it BEFORE looking at the gate, so a change in between
    /// is not missed.
    pub(crate) fn subscribe(&self) -> Option<watch::Receiver<Option<u64>>> {
        self.leased.clone()
    }
}

/// Waits until `rx` changes; forever when there is nothing to watch (or the source is
/// gone: the gate then stays where it is).
pub(crate) async fn changed(rx: &mut Option<watch::Receiver<Option<u64>>>) {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_always_actuates_with_its_epoch() {
        let g = ActuationGate::new(7, &EpochSource::Fixed);
        assert_eq!(g.actuating_epoch(), Some(7));
        assert_eq!(g.reported_epoch(), 7);
        assert!(g.subscribe().is_none());
    }

    #[test]
    fn leased_follows_the_terms_and_reports_the_latest() {
        let (tx, rx) = watch::channel(None);
        let g = ActuationGate::new(3, &EpochSource::Leased(rx));
        assert_eq!(g.actuating_epoch(), None, "no term yet");
        assert_eq!(g.reported_epoch(), 3);
        tx.send_replace(Some(5));
        assert_eq!(g.actuating_epoch(), Some(5));
        tx.send_replace(None);
        assert_eq!(g.actuating_epoch(), None);
        assert_eq!(g.reported_epoch(), 5, "between terms: the last term's");
        tx.send_replace(Some(9));
        assert_eq!(g.reported_epoch(), 9);
    }

    #[tokio::test]
    async fn a_subscription_taken_before_a_change_sees_it() {
        let (tx, rx) = watch::channel(None);
        let g = ActuationGate::new(1, &EpochSource::Leased(rx));
        let mut sub = g.subscribe();
        tx.send_replace(Some(2));
        tokio::time::timeout(std::time::Duration::from_secs(1), changed(&mut sub))
            .await
            .expect("change seen");
        let mut none = ActuationGate::new(1, &EpochSource::Fixed).subscribe();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), changed(&mut none))
                .await
                .is_err()
        );
    }
}
