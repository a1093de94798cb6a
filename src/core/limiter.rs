//! One limiter of any algorithm, as stored under a key, and the effects that
//! change it. An effect is what replication and the AOF carry: applying it
//! needs no clock and no decision, so every copy reaches the same state.

use super::gcra::{self, Gcra};
use super::lease::{self, LeaseChange, LeaseParams, Leases};
use super::sliding_log::{self, LogRecord, SlidingLog};
use super::token_bucket::{self, TokenBucket};
use super::window::{self, Window};
use super::{Millis, Outcome};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limiter {
    TokenBucket(TokenBucket),
    FixedWindow(Window),
    SlidingWindow(Window),
    SlidingLog(Box<SlidingLog>),
    Gcra(Gcra),
    /// Boxed: its leases live on the heap anyway.
    Lease(Box<Leases>),
    /// A limiter locked out (penalty box) until a time: every request is
    /// denied until then, whatever the limiter holds. Boxed: locks are rare,
    /// and the other limiters keep their 48 bytes.
    Locked(Box<Locked>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    pub until: Millis,
    /// Never itself `Locked`.
    pub inner: Limiter,
}

/// The algorithms, for WRONGTYPE errors and the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    SlidingLog = 4,
    Gcra = 5,
    /// 6 is taken by the codec's lock marker.
    Lease = 7,
}

impl Algorithm {
    pub fn description(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "a token bucket (RL.TOKENBUCKET)",
            Algorithm::FixedWindow => "a fixed window (RL.WINDOW)",
            Algorithm::SlidingWindow => "a sliding window counter (RL.WINDOW ... SLIDING)",
            Algorithm::SlidingLog => "a sliding log (RL.SLIDINGLOG)",
            Algorithm::Gcra => "a GCRA limiter (RL.GCRA, RL.THROTTLE, CL.THROTTLE)",
            Algorithm::Lease => "a lease limiter (RL.LEASE)",
        }
    }
}

/// A state change to apply to a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Store this limiter (created or updated), replacing what is there.
    Replace(Limiter),
    /// Log one request in a sliding log, creating the log if it is absent:
    /// O(1) bytes however long the log is.
    LogRecord(LogRecord),
    /// Give back `amount` of a sliding log's newest cost, as of `at`.
    LogRefund { at: Millis, amount: u64 },
    /// Grant, release or extend one lease of a lease limiter.
    Lease(LeaseChange),
}

impl Limiter {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limiter::TokenBucket(_) => Algorithm::TokenBucket,
            Limiter::FixedWindow(_) => Algorithm::FixedWindow,
            Limiter::SlidingWindow(_) => Algorithm::SlidingWindow,
            Limiter::SlidingLog(_) => Algorithm::SlidingLog,
            Limiter::Gcra(_) => Algorithm::Gcra,
            Limiter::Lease(_) => Algorithm::Lease,
            Limiter::Locked(locked) => locked.inner.algorithm(),
        }
    }

    /// The moment the limiter is back to its initial state; its key expires
    /// then, so idle limiters cost nothing. A pure function of the state, so
    /// primary, replicas and AOF replay agree on it.
    pub fn expires_at(&self) -> Millis {
        match self {
            Limiter::TokenBucket(bucket) => bucket.full_at(),
            Limiter::FixedWindow(window) => window.empty_at(false),
            Limiter::SlidingWindow(window) => window.empty_at(true),
            Limiter::SlidingLog(log) => log.empty_at(),
            Limiter::Gcra(gcra) => gcra.full_at(),
            Limiter::Lease(leases) => leases.empty_at(),
            Limiter::Locked(locked) => locked.until.max(locked.inner.expires_at()),
        }
    }

    /// The limiter's state at `now` under its own parameters, as a peek
    /// (`COST 0`) would report it.
    pub fn peek(&self, now: Millis) -> Outcome {
        match self {
            Limiter::TokenBucket(bucket) => {
                token_bucket::decide(Some(bucket), bucket.params, now, 0).0
            }
            Limiter::FixedWindow(w) => window::decide(Some(w), w.params, false, now, 0).0,
            Limiter::SlidingWindow(w) => window::decide(Some(w), w.params, true, now, 0).0,
            Limiter::SlidingLog(log) => sliding_log::decide(Some(log), log.params, now, 0, false).0,
            Limiter::Gcra(g) => gcra::decide(Some(g), g.params(), now, 0).0.outcome(),
            Limiter::Lease(l) => {
                let params = LeaseParams {
                    limit: l.limit,
                    ttl: Millis(1),
                };
                lease::decide(Some(l), params, now, 0).0
            }
            Limiter::Locked(locked) => locked.peek(locked.inner.peek(now), now),
        }
    }

    /// Gives back up to `amount` units at `now` (see each algorithm's
    /// `refund`). Returns the effect to apply (none when nothing comes back)
    /// and how much is given back.
    pub fn refund(&self, now: Millis, amount: u64) -> (Option<Effect>, u64) {
        let (effect, given) = match self {
            Limiter::TokenBucket(b) => {
                let (b, given) = token_bucket::refund(b, now, amount);
                (Effect::Replace(Limiter::TokenBucket(b)), given)
            }
            Limiter::FixedWindow(w) => {
                let (w, given) = window::refund(w, false, now, amount);
                (Effect::Replace(Limiter::FixedWindow(w)), given)
            }
            Limiter::SlidingWindow(w) => {
                let (w, given) = window::refund(w, true, now, amount);
                (Effect::Replace(Limiter::SlidingWindow(w)), given)
            }
            Limiter::SlidingLog(log) => {
                let given = (**log).clone().refund(now, amount);
                (Effect::LogRefund { at: now, amount }, given)
            }
            Limiter::Gcra(g) => {
                let (g, given) = gcra::refund(g, now, amount);
                (Effect::Replace(Limiter::Gcra(g)), given)
            }
            // Slots come back by RL.RELEASE, which names the lease.
            Limiter::Lease(_) => return (None, 0),
            // A refund gives back to the limiter; a lock stays until it ends.
            Limiter::Locked(locked) => {
                let (effect, given) = locked.inner.refund(now, amount);
                let inner = locked.inner.with_effect(effect);
                let relocked = Limiter::Locked(Box::new(Locked {
                    until: locked.until,
                    inner,
                }));
                (Effect::Replace(relocked), given)
            }
        };
        ((given > 0).then_some(effect), given)
    }

    /// This limiter with `effect` applied (a pure twin of what replication
    /// does in place).
    pub fn with_effect(&self, effect: Option<Effect>) -> Limiter {
        let mut out = self.clone();
        match (effect, &mut out) {
            (None, _) => {}
            (Some(Effect::Replace(limiter)), _) => out = limiter,
            (Some(Effect::Lease(change)), Limiter::Lease(leases)) => leases.apply(change),
            (Some(effect), Limiter::SlidingLog(log)) => log.apply_effect(&effect),
            (Some(effect), Limiter::Locked(locked)) => {
                if let Limiter::SlidingLog(log) = &mut locked.inner {
                    log.apply_effect(&effect);
                }
            }
            (Some(_), _) => {}
        }
        out
    }

    /// A lock whose time has passed is no lock: the limiter it holds.
    pub fn unlocked_at(&self, now: Millis) -> &Limiter {
        match self {
            Limiter::Locked(locked) if locked.until <= now => &locked.inner,
            other => other,
        }
    }

    /// Bytes this limiter holds on the heap besides its own allocation.
    pub fn heap_capacity(&self) -> usize {
        match self {
            Limiter::SlidingLog(log) => std::mem::size_of::<SlidingLog>() + log.heap_capacity(),
            Limiter::Lease(leases) => std::mem::size_of::<Leases>() + leases.heap_capacity(),
            Limiter::Locked(locked) => std::mem::size_of::<Locked>() + locked.inner.heap_capacity(),
            _ => 0,
        }
    }
}

impl Locked {
    /// What a peek of a locked limiter reports: nothing remains until the
    /// lock ends, and it is full no earlier than that.
    pub fn peek(&self, inner: Outcome, now: Millis) -> Outcome {
        if self.until <= now {
            return inner;
        }
        Outcome {
            remaining: 0,
            reset_after: inner.reset_after.max(self.until.saturating_sub(now)),
            ..inner
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_fits_in_one_small_allocation() {
        // Token bucket, window and GCRA states are stored inline; only the log
        // is boxed. 48 bytes is one allocation class; 56 would cost 64.
        assert!(
            std::mem::size_of::<Limiter>() <= 48,
            "{}",
            std::mem::size_of::<Limiter>()
        );
    }
}
