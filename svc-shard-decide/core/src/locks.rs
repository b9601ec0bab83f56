//! Decide's locks and the one order they are taken in (ADR-0112).
//!
//! The shard's state is split into a few rooms, each behind one lock, instead
//! of one lock per field. A thread that holds more than one takes them
//! outermost first:
//!
//! | level | lock | holds | taken by |
//! |---|---|---|---|
//! | 0 | `inventory` (async `RwLock`) | the machine inventory | reconcile, cycle, hand-out, transition |
//! | 1 | [`Level::Intake`] | each cluster's demand, sessions, quarantine, first-roll-up gate, what changed since the last cycle | ApplyRollup, session events; the cycle only to take what changed |
//! | 2 | [`Level::Work`] | action ledger, reclaim budget, phase clocks | hand-out, Done, Transition, the cycle's enqueue, reconcile's in-flight check |
//! | 3 | [`Level::Sync`] | provider cursor, listing order, removal guard, local transitions | reconcile, Transition |
//! | 4 | [`Level::Leaf`] | published results and small tables (verdicts, shortfalls, hints, provisioning clock, domains, audit log) | anyone, alone |
//!
//! The cycle's own working state (its demand view, parking ledger) is not
//! shared at all: it lives behind the async one-cycle-at-a-time lock, so
//! nothing the engine reads is ever locked against ingest.
//!
//! In debug builds every [`Ordered`] lock checks the order on acquisition: a
//! thread taking a lock at a level no deeper than one it already holds (two
//! leaves included) panics, naming both. The async inventory lock is not
//! tracked (its guard may move between threads); it is documented as the
//! outermost and only ever taken with no ordered lock held, which the
//! `tracked_held()` assertion at its acquisition points checks.

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::{Deref, DerefMut};

/// Where a lock sits in the order; lower is taken first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Intake = 1,
    Work = 2,
    Sync = 3,
    Leaf = 4,
}

#[cfg(debug_assertions)]
mod check {
    use super::Level;
    use std::cell::RefCell;

    thread_local! {
        static HELD: RefCell<Vec<(Level, &'static str)>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn acquire(level: Level, name: &'static str) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(&(deepest, holder)) = h.iter().max_by_key(|(l, _)| *l)
                && deepest >= level
            {
                // Release the bookkeeping first so the unwinding guards do not trip again.
                h.clear();
                drop(h);
                panic!(
                    "lock order violated: taking {name} ({level:?}) while holding {holder} ({deepest:?})"
                );
            }
            h.push((level, name));
        });
    }

    pub(super) fn release(name: &'static str) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|(_, n)| *n == name) {
                h.remove(i);
            }
        });
    }

    pub(super) fn held() -> usize {
        HELD.with(|h| h.borrow().len())
    }
}

#[cfg(not(debug_assertions))]
mod check {
    use super::Level;
    #[inline(always)]
    pub(super) fn acquire(_: Level, _: &'static str) {}
    #[inline(always)]
    pub(super) fn release(_: &'static str) {}
    #[inline(always)]
    pub(super) fn held() -> usize {
        0
    }
}

/// How many ordered locks this thread holds (always 0 in release builds).
pub fn tracked_held() -> usize {
    check::held()
}

/// A mutex with a place in the lock order.
pub struct Ordered<T> {
    level: Level,
    name: &'static str,
    inner: Mutex<T>,
}

impl<T> Ordered<T> {
    pub fn new(level: Level, name: &'static str, value: T) -> Self {
        Ordered {
            level,
            name,
            inner: Mutex::new(value),
        }
    }

    pub fn lock(&self) -> Guard<'_, T> {
        Tracked::acquire(self.level, self.name, || self.inner.lock())
    }
}

/// A reader-writer lock with a place in the lock order (always a leaf here).
pub struct OrderedRw<T> {
    level: Level,
    name: &'static str,
    inner: RwLock<T>,
}

impl<T> OrderedRw<T> {
    pub fn new(level: Level, name: &'static str, value: T) -> Self {
        OrderedRw {
            level,
            name,
            inner: RwLock::new(value),
        }
    }

    pub fn read(&self) -> ReadGuard<'_, T> {
        Tracked::acquire(self.level, self.name, || self.inner.read())
    }

    pub fn write(&self) -> WriteGuard<'_, T> {
        Tracked::acquire(self.level, self.name, || self.inner.write())
    }
}

/// The guard of an [`Ordered`] lock.
pub type Guard<'a, T> = Tracked<MutexGuard<'a, T>>;
/// A read guard of an [`OrderedRw`] lock.
pub type ReadGuard<'a, T> = Tracked<RwLockReadGuard<'a, T>>;
/// A write guard of an [`OrderedRw`] lock.
pub type WriteGuard<'a, T> = Tracked<RwLockWriteGuard<'a, T>>;

/// A lock guard whose holding the order check knows of until it drops.
pub struct Tracked<G> {
    name: &'static str,
    inner: G,
}

impl<G> Tracked<G> {
    // The check runs before `take` so a wrong order panics instead of deadlocking.
    fn acquire(level: Level, name: &'static str, take: impl FnOnce() -> G) -> Self {
        check::acquire(level, name);
        Tracked {
            name,
            inner: take(),
        }
    }
}

impl<G> Drop for Tracked<G> {
    fn drop(&mut self) {
        check::release(self.name);
    }
}

impl<G: Deref> Deref for Tracked<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.inner
    }
}

impl<G: DerefMut> DerefMut for Tracked<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_order_passes_and_releases() {
        let intake = Ordered::new(Level::Intake, "intake", 1);
        let work = Ordered::new(Level::Work, "work", 2);
        let sync = Ordered::new(Level::Sync, "sync", 3);
        let leaf = OrderedRw::new(Level::Leaf, "leaf", 4);
        {
            let a = intake.lock();
            let b = work.lock();
            let c = sync.lock();
            let d = leaf.read();
            assert_eq!(*a + *b + *c + *d, 10);
            if cfg!(debug_assertions) {
                assert_eq!(tracked_held(), 4);
            }
        }
        assert_eq!(tracked_held(), 0);
        // Taken one after the other (not nested), any order is fine.
        drop(leaf.write());
        drop(intake.lock());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(
        expected = "lock order violated: taking intake (Intake) while holding work (Work)"
    )]
    fn a_wrong_order_trips_the_check() {
        let intake = Ordered::new(Level::Intake, "intake", ());
        let work = Ordered::new(Level::Work, "work", ());
        let _w = work.lock();
        let _i = intake.lock();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(
        expected = "lock order violated: taking hints (Leaf) while holding verdicts (Leaf)"
    )]
    fn two_leaves_never_nest() {
        let verdicts = OrderedRw::new(Level::Leaf, "verdicts", ());
        let hints = Ordered::new(Level::Leaf, "hints", ());
        let _v = verdicts.read();
        let _h = hints.lock();
    }
}
