//! Token bucket: `capacity` tokens, refilled continuously at `refill_amount`
//! tokens per `refill_period`. A new bucket is full; a request takes `cost`
//! tokens when that many are there.
//!
//! Exactness: the level is kept in units of 1/refill_period of a token
//! ("scaled tokens"). Over `d` milliseconds the bucket gains
//! `refill_amount * d` scaled tokens, an integer, so no rounding ever happens
//! while refilling, however odd the rate.

use super::bounds::clock;
use super::{until, Millis, Outcome, RetryAfter};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketParams {
    pub capacity: u64,
    pub refill_amount: u64,
    pub refill_period: Millis,
}

impl TokenBucketParams {
    fn period(&self) -> u128 {
        u128::from(self.refill_period.0.max(1))
    }

    fn full_level(&self) -> u128 {
        u128::from(self.capacity) * self.period()
    }

    /// Milliseconds needed to refill `deficit` scaled tokens.
    fn refill_time(&self, deficit: u128) -> Millis {
        Millis::from_u128_saturating(deficit.div_ceil(u128::from(self.refill_amount.max(1))))
    }
}

/// The stored state. Parameters are kept so that a later call with other
/// parameters can carry the state over, and so the state alone tells when the
/// bucket will be full again (its key's expiry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub params: TokenBucketParams,
    /// Time of the last update; never moves backwards.
    pub last: Millis,
    /// Scaled tokens at `last`, split to keep the struct 8-aligned and small:
    /// the level is below capacity x period <= 10^15 x 3.2 x 10^11 < 2^89, so
    /// 32 high bits are plenty.
    level_hi: u32,
    level_lo: u64,
    /// A byte with 255 invalid values: `Limiter` keeps its variant tag there,
    /// which makes every limiter one 48-byte allocation instead of 64.
    _tag_room: TagRoom,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum TagRoom {
    Here = 0,
}

impl TokenBucket {
    /// `level` is clamped to the bucket's capacity (callers never exceed it).
    pub fn new(params: TokenBucketParams, last: Millis, level: u128) -> TokenBucket {
        let level = level.min(params.full_level());
        TokenBucket {
            params,
            last,
            level_hi: (level >> 64) as u32,
            level_lo: level as u64,
            _tag_room: TagRoom::Here,
        }
    }

    pub fn full(params: TokenBucketParams, now: Millis) -> TokenBucket {
        TokenBucket::new(params, now, params.full_level())
    }

    pub fn level(&self) -> u128 {
        (u128::from(self.level_hi) << 64) | u128::from(self.level_lo)
    }

    /// A state loaded from outside (RDB, RESTORE, replication) is only
    /// accepted when this code could have produced it.
    pub fn restored(params: TokenBucketParams, last: Millis, level: u128) -> Option<TokenBucket> {
        (level <= params.full_level()).then(|| TokenBucket::new(params, last, level))
    }

    /// The moment the bucket is full again: its key expires then.
    pub fn full_at(&self) -> Millis {
        let deficit = self.params.full_level() - self.level().min(self.params.full_level());
        self.last.saturating_add(self.params.refill_time(deficit))
    }

    /// The state at `now` under its own parameters, then carried over to
    /// `params`: the fraction of a token rescales (rounding down) and the level
    /// clamps to the new capacity. A clock that went back refills nothing.
    fn advanced(&self, params: TokenBucketParams, now: Millis) -> TokenBucket {
        let old = self.params;
        let elapsed = u128::from(now.saturating_sub(self.last).0);
        let refilled = self
            .level()
            .saturating_add(elapsed.saturating_mul(u128::from(old.refill_amount)))
            .min(old.full_level());
        let rescaled = if old.refill_period == params.refill_period {
            refilled
        } else {
            refilled.saturating_mul(params.period()) / old.period()
        };
        TokenBucket::new(
            params,
            self.last.max(now),
            rescaled.min(params.full_level()),
        )
    }
}

/// Gives back up to `amount` tokens at `now`, capped at the capacity.
/// Returns the new state and the tokens given back (a fraction of a token
/// of room counts as one).
pub fn refund(bucket: &TokenBucket, now: Millis, amount: u64) -> (TokenBucket, u64) {
    let now = clock(now);
    let current = bucket.advanced(bucket.params, now);
    let full = current.params.full_level();
    let period = current.params.period();
    let level = current.level();
    let after = level.saturating_add(u128::from(amount) * period).min(full);
    let given = u64::try_from((after - level).div_ceil(period)).unwrap_or(amount);
    (
        TokenBucket::new(current.params, current.last, after),
        given.min(amount),
    )
}

/// Decides a request of `cost` tokens at `now`. Returns the outcome and, when
/// the request changes the state (it consumed tokens, or changed the
/// parameters), the new state. A peek (cost 0) never changes it.
pub fn decide(
    state: Option<&TokenBucket>,
    params: TokenBucketParams,
    now: Millis,
    cost: u64,
) -> (Outcome, Option<TokenBucket>) {
    let now = clock(now);
    let current = match state {
        Some(bucket) => bucket.advanced(params, now),
        None => TokenBucket::full(params, now),
    };
    let period = params.period();
    let level = current.level();
    let wanted = u128::from(cost) * period;

    let allowed = cost <= params.capacity && wanted <= level;
    let after = if allowed { level - wanted } else { level };
    let retry_after = if allowed {
        RetryAfter::After(Millis::ZERO)
    } else if cost > params.capacity {
        RetryAfter::Never
    } else {
        let ready_at = current
            .last
            .saturating_add(params.refill_time(wanted - level));
        RetryAfter::After(until(ready_at, now))
    };
    let next = TokenBucket::new(params, current.last, after);
    let outcome = Outcome {
        allowed,
        limit: params.capacity,
        remaining: u64::try_from(after / period).unwrap_or(u64::MAX),
        retry_after,
        // A full bucket is full now, even if its time is ahead of a clock that went back.
        reset_after: if after >= params.full_level() {
            Millis::ZERO
        } else {
            until(next.full_at(), now)
        },
    };
    // New parameters are stored even by a denied request: the reply was
    // computed under them, so the bucket must go on refilling under them.
    let reparametrised = state.is_some_and(|bucket| bucket.params != params);
    let changed = cost > 0 && (allowed || reparametrised);
    (outcome, changed.then_some(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(capacity: u64, refill_amount: u64, refill_period: u64) -> TokenBucketParams {
        TokenBucketParams {
            capacity,
            refill_amount,
            refill_period: Millis(refill_period),
        }
    }

    #[test]
    fn new_bucket_is_full_and_drains_exactly() {
        let p = params(3, 1, 1000);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (out, next) = decide(state.as_ref(), p, Millis(10_000), 1);
            assert!(out.allowed);
            assert_eq!(out.remaining, expected_remaining);
            state = next;
        }
        let (out, next) = decide(state.as_ref(), p, Millis(10_000), 1);
        assert!(!out.allowed);
        assert!(next.is_none());
        assert_eq!(out.retry_after, RetryAfter::After(Millis(1000)));
        assert_eq!(out.reset_after, Millis(3000));
    }

    #[test]
    fn retry_after_is_exact_for_fractional_rates() {
        // 3 tokens per 1000 ms: one token every 333.33 ms.
        let p = params(1, 3, 1000);
        let (_, state) = decide(None, p, Millis(0), 1);
        let (out, _) = decide(state.as_ref(), p, Millis(0), 1);
        assert_eq!(out.retry_after, RetryAfter::After(Millis(334)));
        let (early, _) = decide(state.as_ref(), p, Millis(333), 1);
        assert!(!early.allowed);
        let (on_time, _) = decide(state.as_ref(), p, Millis(334), 1);
        assert!(on_time.allowed);
    }

    #[test]
    fn cost_above_capacity_can_never_pass() {
        let (out, next) = decide(None, params(5, 1, 1000), Millis(0), 6);
        assert!(!out.allowed);
        assert_eq!(out.retry_after, RetryAfter::Never);
        assert!(next.is_none());
    }

    #[test]
    fn cost_zero_peeks_without_changing_state() {
        let p = params(5, 1, 1000);
        let (_, state) = decide(None, p, Millis(0), 2);
        let (out, next) = decide(state.as_ref(), p, Millis(0), 0);
        assert!(out.allowed);
        assert_eq!(out.remaining, 3);
        assert!(next.is_none());
    }

    #[test]
    fn clock_going_back_creates_no_tokens() {
        let p = params(2, 1, 1000);
        let (_, s1) = decide(None, p, Millis(50_000), 2);
        let (out, s2) = decide(s1.as_ref(), p, Millis(10_000), 1);
        assert!(!out.allowed);
        assert!(s2.is_none());
        // 1000 ms after the stored time, one token is back, measured from now.
        assert_eq!(out.retry_after, RetryAfter::After(Millis(41_000)));
    }

    #[test]
    fn smaller_capacity_clamps_tokens() {
        let (_, s) = decide(None, params(100, 1, 1000), Millis(0), 1);
        let (out, _) = decide(s.as_ref(), params(10, 1, 1000), Millis(0), 0);
        assert_eq!(out.remaining, 10);
        assert_eq!(out.limit, 10);
    }

    #[test]
    fn huge_rates_stay_exact() {
        let p = params(1_000_000_000_000_000, 1_000_000_000, 1000);
        let (out, s) = decide(None, p, Millis(0), 1_000_000_000_000_000);
        assert!(out.allowed);
        assert_eq!(out.remaining, 0);
        let (out, _) = decide(s.as_ref(), p, Millis(1), 0);
        assert_eq!(out.remaining, 1_000_000);
        assert_eq!(out.reset_after, Millis(999_999_999));
    }

    #[test]
    fn struct_stays_small() {
        assert_eq!(std::mem::size_of::<TokenBucket>(), 48);
    }
}
