//! Stamping provider calls from a WorkItem's fencing window.

use bigfleet_proto::mesh::v1 as mesh;

/// One stamped token: what goes into the request's `shard_id`,
/// `shard_epoch` and `sequence_number` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub shard_id: String,
    pub epoch: i64,
    pub sequence: i64,
}

/// Why no more stamps can be issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    #[error("work item has no fencing window")]
    Missing,
    #[error("invalid fencing window: base {base}, limit {limit}")]
    InvalidWindow { base: i64, limit: i64 },
    #[error("fencing sequence window [{base}, {limit}) exhausted")]
    Exhausted { base: i64, limit: i64 },
}

/// Hands out `sequence_base + attempt` for every provider mutation of one
/// action, attempt counting from zero across all calls and retries, and
/// refuses to reach `sequence_limit`: a number is never used twice and
/// never leaks into the next action's window.
#[derive(Debug, Clone)]
pub struct Stamper {
    shard_id: String,
    epoch: i64,
    base: i64,
    limit: i64,
    attempts: i64,
}

impl Stamper {
    pub fn new(fencing: Option<&mesh::Fencing>) -> Result<Self, StampError> {
        let f = fencing.ok_or(StampError::Missing)?;
        // Zero is the "unfenced" token at providers; a window must be non-empty.
        if f.sequence_base <= 0 || f.sequence_limit <= f.sequence_base {
            return Err(StampError::InvalidWindow {
                base: f.sequence_base,
                limit: f.sequence_limit,
            });
        }
        Ok(Self {
            shard_id: f.shard_id.clone(),
            epoch: f.epoch,
            base: f.sequence_base,
            limit: f.sequence_limit,
            attempts: 0,
        })
    }

    /// The token for the next attempt.
    pub fn stamp(&mut self) -> Result<Stamp, StampError> {
        let sequence = self
            .base
            .checked_add(self.attempts)
            .filter(|s| *s < self.limit)
            .ok_or(StampError::Exhausted {
                base: self.base,
                limit: self.limit,
            })?;
        self.attempts += 1;
        Ok(Stamp {
            shard_id: self.shard_id.clone(),
            epoch: self.epoch,
            sequence,
        })
    }

    /// Stamps issued so far.
    pub fn attempts(&self) -> i64 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn window(base: i64, limit: i64) -> mesh::Fencing {
        mesh::Fencing {
            shard_id: "s1".into(),
            epoch: 7,
            sequence_base: base,
            sequence_limit: limit,
        }
    }

    #[test]
    fn stamps_base_plus_attempt_until_the_limit() {
        let mut s = Stamper::new(Some(&window(100, 103))).unwrap();
        let seqs: Vec<_> = (0..3).map(|_| s.stamp().unwrap().sequence).collect();
        assert_eq!(seqs, [100, 101, 102]);
        assert_eq!(
            s.stamp(),
            Err(StampError::Exhausted {
                base: 100,
                limit: 103
            })
        );
        assert_eq!(s.attempts(), 3);
        let t = Stamper::new(Some(&window(5, 6))).unwrap().stamp().unwrap();
        assert_eq!(
            t,
            Stamp {
                shard_id: "s1".into(),
                epoch: 7,
                sequence: 5
            }
        );
    }

    #[test]
    fn rejects_missing_and_empty_windows() {
        assert_eq!(Stamper::new(None).unwrap_err(), StampError::Missing);
        for (b, l) in [(0, 10), (-1, 10), (10, 10), (10, 9)] {
            assert!(matches!(
                Stamper::new(Some(&window(b, l))),
                Err(StampError::InvalidWindow { .. })
            ));
        }
    }

    proptest! {
        #[test]
        fn sequences_strictly_increase_and_stay_in_the_window(
            base in 1i64..1_000_000, len in 1i64..200, draws in 0usize..300
        ) {
            let mut s = Stamper::new(Some(&window(base, base + len))).unwrap();
            let mut last = 0;
            for _ in 0..draws {
                match s.stamp() {
                    Ok(t) => {
                        prop_assert!(t.sequence > last);
                        prop_assert!(t.sequence >= base && t.sequence < base + len);
                        last = t.sequence;
                    }
                    Err(e) => {
                        let exhausted = matches!(e, StampError::Exhausted { .. });
                        prop_assert!(exhausted);
                    }
                }
            }
        }
    }
}
