//! Exponential backoff with jitter: the one retry-delay policy of the workspace.
//!
//! Every reconnect or retry loop waits through this module instead of doubling a
//! `Duration` by hand, so each gets the same cap arithmetic (no overflow, no panic on a
//! huge retry count) and jitter: replicas restarted together do not retry in lock-step.
//!
//! [`BackoffPolicy`] is the pure part — the window of retry *n* and a delay drawn from it
//! with a caller's RNG; [`Backoff`] is the stateful loop companion (next delay, reset on
//! success, sleep) that owns its RNG, seedable for reproducible tests and load runs. It is
//! also an endless [`Iterator`] of delays, the shape openraft's `Backoff` takes.
//!
//! [`poll_until`] is the other kind of wait: a condition polled at a fixed pace until a
//! deadline (a child answering `/readyz`, a file appearing), for production code. Tests wait
//! through `bigfleet_testkit::wait_until`, which panics instead of returning.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// How a delay is drawn from the window `[0, ceiling]` of a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Uniform in `[0, ceiling]`: the widest spread, but a retry may follow at once.
    Full,
    /// Uniform in `[ceiling / 2, ceiling]`: spread out, yet never sooner than half the
    /// window — the default, for loops that must not hammer a peer that just failed.
    #[default]
    Equal,
}

/// Exponential growth from `initial` by `multiplier` per retry, capped at `max`, with
/// [`Jitter`].
///
/// Retries are counted from 0: retry 0 draws from `[.., initial]`. A `max` below `initial`
/// is read as `initial` (the cap never undercuts the first window) and a multiplier below
/// 1 (or NaN) as 1 (the window never shrinks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub jitter: Jitter,
}

impl BackoffPolicy {
    /// Doubling from `initial` to `max`, equal jitter.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            multiplier: 2.0,
            jitter: Jitter::Equal,
        }
    }

    #[must_use]
    pub const fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    #[must_use]
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The largest delay any retry can get.
    pub fn cap(&self) -> Duration {
        self.max.max(self.initial)
    }

    /// The un-jittered window of retry `retry` (0-based): `initial · multiplier^retry`,
    /// at most [`cap`](Self::cap).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let cap = self.cap();
        // `f64::max` returns the other operand for NaN, so NaN reads as 1.
        let m = self.multiplier.max(1.0);
        let exp = i32::try_from(retry).unwrap_or(i32::MAX);
        let secs = self.initial.as_secs_f64() * m.powi(exp);
        // Compared in f64 first: `Duration::from_secs_f64` panics past its range.
        if !secs.is_finite() || secs >= cap.as_secs_f64() {
            cap
        } else {
            Duration::from_secs_f64(secs).min(cap)
        }
    }

    /// The smallest delay retry `retry` can get under this policy's jitter.
    pub fn floor(&self, retry: u32) -> Duration {
        match self.jitter {
            Jitter::Full => Duration::ZERO,
            Jitter::Equal => {
                let c = self.ceiling(retry);
                c - c / 2
            }
        }
    }

    /// The delay before retry `retry` (0-based), drawn with `rng`.
    pub fn delay_with<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let floor = self.floor(retry);
        let span = (self.ceiling(retry) - floor)
            .as_nanos()
            .min(u128::from(u64::MAX)) as u64;
        floor + Duration::from_nanos(rng.random_range(0..=span))
    }

    /// [`delay_with`](Self::delay_with) on the thread's RNG.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, &mut rand::rng())
    }
}

/// A retry loop's backoff state: the policy, the retries since the last success and an RNG.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: BackoffPolicy,
    retry: u32,
    rng: SmallRng,
}

impl Backoff {
    /// Seeded from the OS: independent replicas draw independent delays.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self::with_rng(policy, SmallRng::from_os_rng())
    }

    /// Reproducible delays (tests, load runs keyed by a name).
    pub fn seeded(policy: BackoffPolicy, seed: u64) -> Self {
        Self::with_rng(policy, SmallRng::seed_from_u64(seed))
    }

    fn with_rng(policy: BackoffPolicy, rng: SmallRng) -> Self {
        Self {
            policy,
            retry: 0,
            rng,
        }
    }

    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// Delays handed out since the last [`reset`](Self::reset).
    pub fn retries(&self) -> u32 {
        self.retry
    }

    /// The next delay; each call widens the window until the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.policy.delay_with(self.retry, &mut self.rng);
        self.retry = self.retry.saturating_add(1);
        d
    }

    /// Back to the first window (after a success).
    pub fn reset(&mut self) {
        self.retry = 0;
    }

    /// Sleeps for [`next_delay`](Self::next_delay) and says how long that was.
    pub async fn sleep(&mut self) -> Duration {
        let d = self.next_delay();
        tokio::time::sleep(d).await;
        d
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    /// Never ends: a backoff has no last retry (bound attempts elsewhere).
    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// Runs `check` every `every` until it is done (`Ok(Some(v))`) or fails (`Err(e)`), both
/// returned at once; `Ok(None)` once `within` has passed with the check still not done.
/// The check always runs once more at the deadline, so a zero `within` is one try.
///
/// A check that borrows from its caller can leave the caller's future `Send` for one
/// lifetime only (a compiler limitation of async closures); where that future is spawned,
/// give the check owned copies (`async move ||`).
pub async fn poll_until<T, E>(
    within: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(done) = check().await? {
            return Ok(Some(done));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(every.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[tokio::test(start_paused = true)]
    async fn poll_until_returns_the_value_an_error_or_none_at_the_deadline() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let done = poll_until(Duration::from_secs(1), 10 * MS, async || {
            tries += 1;
            Ok::<_, String>((tries == 3).then_some(tries))
        })
        .await;
        assert_eq!(done, Ok(Some(3)));
        assert_eq!(started.elapsed(), 20 * MS, "two pauses between three tries");

        let failed = poll_until(Duration::from_secs(1), 10 * MS, async || {
            Err::<Option<()>, _>("child exited")
        })
        .await;
        assert_eq!(
            failed,
            Err("child exited"),
            "an error ends the wait at once"
        );

        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let timed_out = poll_until(Duration::from_millis(95), 10 * MS, async || {
            tries += 1;
            Ok::<Option<()>, String>(None)
        })
        .await;
        assert_eq!(timed_out, Ok(None));
        assert_eq!(started.elapsed(), 95 * MS, "no sleep past the deadline");
        assert_eq!(tries, 11, "ten paced tries and one at the deadline");
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn equal_jitter_stays_in_the_upper_half_of_a_doubling_window() {
        let mut b = Backoff::seeded(BackoffPolicy::new(100 * MS, 1000 * MS), 7);
        for (retry, (lo, hi)) in [(50, 100), (100, 200), (200, 400), (400, 800), (500, 1000)]
            .into_iter()
            .enumerate()
        {
            let d = b.next_delay();
            assert!(d >= lo * MS && d <= hi * MS, "retry {retry}: {d:?}");
        }
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(d >= 500 * MS && d <= 1000 * MS, "{d:?}");
        }
        assert_eq!(b.retries(), 105);
    }

    #[test]
    fn full_jitter_reaches_below_half_the_window() {
        let p = BackoffPolicy::new(100 * MS, 100 * MS).with_jitter(Jitter::Full);
        let mut b = Backoff::seeded(p, 1);
        let low = (0..200).map(|_| b.next_delay()).filter(|d| *d < 50 * MS);
        assert!(
            low.count() > 0,
            "full jitter never went below the half window"
        );
        assert_eq!(p.floor(3), Duration::ZERO);
    }

    #[test]
    fn reset_returns_to_the_first_window() {
        let mut b = Backoff::seeded(BackoffPolicy::new(100 * MS, 10_000 * MS), 3);
        for _ in 0..10 {
            b.next_delay();
        }
        assert!(b.next_delay() >= 5_000 * MS);
        b.reset();
        assert_eq!(b.retries(), 0);
        assert!(b.next_delay() <= 100 * MS);
    }

    #[test]
    fn same_seed_same_delays_and_jitter_varies() {
        let p = BackoffPolicy::new(100 * MS, 100 * MS);
        let a: Vec<_> = Backoff::seeded(p, 42).take(20).collect();
        let b: Vec<_> = Backoff::seeded(p, 42).take(20).collect();
        assert_eq!(a, b);
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 1, "jitter must vary: {a:?}");
        let c: Vec<_> = Backoff::seeded(p, 43).take(20).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn degenerate_settings_never_panic_or_shrink() {
        // max below initial reads as initial; a multiplier below 1 or NaN reads as 1.
        let p = BackoffPolicy::new(200 * MS, 50 * MS).with_multiplier(0.5);
        assert_eq!(p.cap(), 200 * MS);
        assert_eq!(p.ceiling(5), 200 * MS);
        let nan = BackoffPolicy::new(10 * MS, 1000 * MS).with_multiplier(f64::NAN);
        assert_eq!(nan.ceiling(9), 10 * MS);
        let huge = BackoffPolicy::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(huge.ceiling(u32::MAX), Duration::MAX);
        assert!(huge.delay(u32::MAX) >= Duration::MAX / 2);
        let zero = BackoffPolicy::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.delay(3), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_waits_the_delay_it_reports() {
        let mut b = Backoff::seeded(BackoffPolicy::new(100 * MS, 300 * MS), 9);
        let t0 = tokio::time::Instant::now();
        let d = b.sleep().await;
        // Paused clock; tokio's timer rounds a deadline up to the next millisecond.
        let slept = t0.elapsed();
        assert!(slept >= d && slept <= d + MS, "slept {slept:?} for {d:?}");
        assert!(d >= 50 * MS && d <= 100 * MS);
    }

    fn policies() -> impl Strategy<Value = BackoffPolicy> {
        (
            0u64..5_000,
            0u64..120_000,
            1.0f64..4.0,
            prop_oneof![Just(Jitter::Full), Just(Jitter::Equal)],
        )
            .prop_map(|(initial, max, m, jitter)| {
                BackoffPolicy::new(Duration::from_millis(initial), Duration::from_millis(max))
                    .with_multiplier(m)
                    .with_jitter(jitter)
            })
    }

    proptest! {
        #[test]
        fn delays_stay_between_floor_and_cap(p in policies(), seed: u64, n in 1usize..80) {
            let mut b = Backoff::seeded(p, seed);
            for retry in 0..n as u32 {
                let d = b.next_delay();
                prop_assert!(d >= p.floor(retry), "retry {retry}: {d:?} < {:?}", p.floor(retry));
                prop_assert!(d <= p.ceiling(retry), "retry {retry}: {d:?} > ceiling");
                prop_assert!(d <= p.cap(), "retry {retry}: {d:?} > cap {:?}", p.cap());
            }
        }

        #[test]
        fn windows_grow_until_the_cap(p in policies(), retry in 0u32..200) {
            let (now, next) = (p.ceiling(retry), p.ceiling(retry + 1));
            prop_assert!(next >= now);
            prop_assert!(p.floor(retry + 1) >= p.floor(retry));
            // Strict growth while below the cap (past rounding of sub-microsecond windows).
            if p.multiplier >= 1.01 && now < p.cap() && now >= MS {
                prop_assert!(next > now, "{now:?} -> {next:?}");
            }
            // With real growth the cap is reached (0.05 ms · 1.1^1000 ≫ 120 s).
            if p.multiplier >= 1.1 && p.initial >= MS / 20 {
                prop_assert_eq!(p.ceiling(1000), p.cap());
            }
        }
    }
}
