//! The lease-validity rule (ADR-0071): a holder may act only while it can PROVE, on its own
//! monotonic clock, that etcd still considers its lease alive.
//!
//! etcd restarts a lease's countdown when it RECEIVES a keep-alive, which is never before
//! the holder SENT it. So if a keep-alive sent at local instant `s` is answered with TTL
//! `t`, the lease lives on the server until at least `s + t` (server time). The holder
//! takes `s + t - margin` as its own deadline; the margin absorbs the rate difference
//! between the two clocks and the time between "deadline passed" and "last action
//! stopped". Nothing else extends the deadline: not a request that is still in flight,
//! not a reconnect, and not an answer that arrives after the deadline already passed
//! (the term is over by then, whatever etcd says).

use std::time::{Duration, Instant};

use crate::ShardLeaseError;

/// Timing of one leader lease, derived from [`crate::EtcdConfig`] and checked once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// Lease TTL asked of etcd (whole seconds: etcd's unit).
    pub ttl: Duration,
    /// How often the holder sends a keep-alive.
    pub keepalive_interval: Duration,
    /// Subtracted from every proven expiry (see the module docs).
    pub safety_margin: Duration,
    /// Bound on each unary etcd call.
    pub request_timeout: Duration,
}

/// Shortest TTL accepted: etcd 3.4 raises anything below its minimum (1.5 × election
/// timeout, 1.5 s with default settings) anyway, and a shorter window leaves no room for
/// one lost keep-alive.
pub const MIN_TTL: Duration = Duration::from_secs(2);

impl LeaseTiming {
    /// Derives and checks the timing. Defaults: keep-alive every `ttl/3`, margin
    /// `max(ttl/5, 200ms)`, request timeout `ttl/3`.
    pub fn new(
        ttl: Duration,
        safety_margin: Option<Duration>,
        request_timeout: Option<Duration>,
    ) -> Result<Self, ShardLeaseError> {
        if ttl < MIN_TTL {
            return Err(ShardLeaseError::Config(format!(
                "lease ttl {ttl:?} is below the minimum {MIN_TTL:?}"
            )));
        }
        if ttl.subsec_nanos() != 0 {
            return Err(ShardLeaseError::Config(format!(
                "lease ttl {ttl:?} must be whole seconds (etcd's unit)"
            )));
        }
        let keepalive_interval = ttl / 3;
        let safety_margin = safety_margin.unwrap_or((ttl / 5).max(Duration::from_millis(200)));
        // One keep-alive may be late by a full interval and the lease must still be
        // provable: margin + interval must leave part of the TTL.
        if safety_margin + keepalive_interval >= ttl {
            return Err(ShardLeaseError::Config(format!(
                "safety margin {safety_margin:?} plus keep-alive interval {keepalive_interval:?} \
                 leaves nothing of the lease ttl {ttl:?}"
            )));
        }
        let request_timeout = request_timeout.unwrap_or(ttl / 3);
        if request_timeout.is_zero() {
            return Err(ShardLeaseError::Config(
                "request timeout must be positive".to_owned(),
            ));
        }
        Ok(Self {
            ttl,
            keepalive_interval,
            safety_margin,
            request_timeout,
        })
    }

    /// The TTL in etcd's unit.
    pub fn ttl_secs(&self) -> i64 {
        i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX)
    }
}

/// One term's proof of lease validity. A fresh clock per term: once it has lapsed it never
/// becomes valid again, because resuming requires a new term with a higher epoch.
#[derive(Debug, Clone)]
pub struct LeaseClock {
    margin: Duration,
    valid_until: Option<Instant>,
    lapsed: bool,
}

impl LeaseClock {
    /// A clock with no proof yet (not valid).
    pub fn new(margin: Duration) -> Self {
        Self {
            margin,
            valid_until: None,
            lapsed: false,
        }
    }

    /// Records etcd's answer `ttl_secs` to a grant or keep-alive SENT at `sent`, as seen
    /// at `now`. Returns whether the lease is (still) provably valid. A non-positive TTL
    /// means etcd no longer knows the lease: the term is over.
    pub fn renewed(&mut self, sent: Instant, ttl_secs: i64, now: Instant) -> bool {
        if self.lapsed {
            return false;
        }
        if ttl_secs <= 0 {
            self.lapse();
            return false;
        }
        // An answer that arrives after the deadline cannot revive the term: between the
        // deadline and now the holder was, by its own rule, not entitled to act, and a
        // standby may have been told the same by etcd.
        if self.valid_until.is_some() && !self.is_valid(now) {
            self.lapse();
            return false;
        }
        let proven = sent
            .checked_add(Duration::from_secs(ttl_secs.unsigned_abs()))
            .and_then(|t| t.checked_sub(self.margin));
        if let Some(proven) = proven {
            self.valid_until = Some(self.valid_until.map_or(proven, |v| v.max(proven)));
        }
        self.is_valid(now)
    }

    /// Ends the term for good.
    pub fn lapse(&mut self) {
        self.lapsed = true;
    }

    /// The local instant the proof runs out (`None` before the first proof or after a
    /// lapse).
    pub fn valid_until(&self) -> Option<Instant> {
        if self.lapsed { None } else { self.valid_until }
    }

    /// Whether the holder may act at `now`.
    pub fn is_valid(&self, now: Instant) -> bool {
        !self.lapsed && self.valid_until.is_some_and(|v| now < v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn timing_defaults_and_rejections() {
        let t = LeaseTiming::new(10 * S, None, None).unwrap();
        assert_eq!(
            t.keepalive_interval,
            Duration::from_millis(3333) + Duration::from_nanos(333_333)
        );
        assert_eq!(t.safety_margin, 2 * S);
        assert_eq!(t.ttl_secs(), 10);
        let t = LeaseTiming::new(2 * S, None, None).unwrap();
        assert_eq!(t.safety_margin, Duration::from_millis(400));

        assert!(
            LeaseTiming::new(S, None, None).is_err(),
            "below the minimum"
        );
        assert!(LeaseTiming::new(Duration::from_millis(2500), None, None).is_err());
        assert!(
            LeaseTiming::new(3 * S, Some(2 * S), None).is_err(),
            "margin eats the ttl"
        );
        assert!(LeaseTiming::new(3 * S, Some(Duration::from_millis(1900)), None).is_ok());
        assert!(LeaseTiming::new(3 * S, None, Some(Duration::ZERO)).is_err());
    }

    #[test]
    fn validity_runs_from_the_send_instant_minus_the_margin() {
        let t0 = Instant::now();
        let mut c = LeaseClock::new(Duration::from_millis(500));
        assert!(!c.is_valid(t0), "no proof yet");
        // Sent at t0, answered 1.9 s later: the proof still counts from t0.
        assert!(c.renewed(t0, 3, t0 + Duration::from_millis(1900)));
        assert_eq!(c.valid_until(), Some(t0 + Duration::from_millis(2500)));
        assert!(c.is_valid(t0 + Duration::from_millis(2499)));
        assert!(!c.is_valid(t0 + Duration::from_millis(2500)));
        // A later keep-alive extends it.
        assert!(c.renewed(t0 + S, 3, t0 + Duration::from_millis(1100)));
        assert_eq!(c.valid_until(), Some(t0 + Duration::from_millis(3500)));
    }

    #[test]
    fn a_late_answer_or_a_lost_lease_ends_the_term_for_good() {
        let t0 = Instant::now();
        let mut c = LeaseClock::new(Duration::from_millis(500));
        assert!(c.renewed(t0, 2, t0));
        // The answer to a keep-alive sent in time arrives after the deadline.
        assert!(!c.renewed(t0 + S, 2, t0 + 2 * S));
        assert!(!c.renewed(t0 + 2 * S, 2, t0 + 2 * S), "stays lapsed");
        assert_eq!(c.valid_until(), None);

        let mut c = LeaseClock::new(Duration::from_millis(500));
        assert!(c.renewed(t0, 2, t0));
        assert!(!c.renewed(t0, 0, t0), "ttl 0: etcd forgot the lease");
        assert!(!c.is_valid(t0));
        assert!(!c.renewed(t0, 2, t0));
    }

    proptest! {
        /// Whatever the answers and delays, the clock never claims validity beyond
        /// (latest send with a positive answer) + ttl - margin, and never after a lapse.
        #[test]
        fn never_valid_beyond_the_latest_proof(
            steps in proptest::collection::vec((0u64..1500, 0u64..2000, -1i64..4), 1..40),
        ) {
            let margin = Duration::from_millis(300);
            let t0 = Instant::now();
            let mut c = LeaseClock::new(margin);
            let mut sent = t0;
            let mut bound: Option<Instant> = None;
            let mut lapsed = false;
            for (gap, delay, ttl) in steps {
                sent += Duration::from_millis(gap);
                let now = sent + Duration::from_millis(delay);
                let was_valid_or_fresh = c.valid_until().is_none() || c.is_valid(now);
                let ok = c.renewed(sent, ttl, now);
                if ttl <= 0 || !was_valid_or_fresh { lapsed = true; }
                if !lapsed && ttl > 0 {
                    let b = sent + Duration::from_secs(ttl as u64) - margin;
                    bound = Some(bound.map_or(b, |x: Instant| x.max(b)));
                }
                if lapsed {
                    prop_assert!(!ok);
                    prop_assert!(!c.is_valid(now));
                } else if let Some(b) = bound {
                    prop_assert!(c.valid_until().is_some_and(|v| v <= b));
                    prop_assert_eq!(ok, now < b);
                }
            }
        }
    }
}
