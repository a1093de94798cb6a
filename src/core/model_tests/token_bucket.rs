//! Token bucket against its model (exact rationals), with random parameter
//! changes, and deterministic reproductions of earlier findings.

use std::cmp::Ordering;

use proptest::collection::vec;
use proptest::prelude::*;

use super::{
    advance, check_first, check_outcome, check_retry, config, cost_for, count, period, start,
    steps, tb_params, Step, Verdict,
};
use crate::core::token_bucket::{self, TokenBucket, TokenBucketParams};
use crate::core::{Millis, RetryAfter};

// ---------------------------------------------------------------------------
// Exact non-negative rationals.

#[derive(Clone, Copy, Debug)]
struct Q {
    n: u128,
    d: u128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Q {
    fn new(n: u128, d: u128) -> Q {
        assert!(d > 0);
        let g = gcd(n, d);
        Q { n: n / g, d: d / g }
    }

    fn int(x: u64) -> Q {
        Q {
            n: u128::from(x),
            d: 1,
        }
    }

    fn add(self, o: Q) -> Q {
        Q::new(self.n * o.d + o.n * self.d, self.d * o.d)
    }

    fn sub(self, o: Q) -> Q {
        assert!(o <= self);
        Q::new(self.n * o.d - o.n * self.d, self.d * o.d)
    }

    fn floor(self) -> u64 {
        u64::try_from(self.n / self.d).unwrap()
    }

    /// The largest multiple of `1/den` that is not above `self`.
    fn floor_to(self, den: u128) -> Q {
        Q::new(self.n * den / self.d, den)
    }
}

impl Ord for Q {
    fn cmp(&self, o: &Q) -> Ordering {
        (self.n * o.d).cmp(&(o.n * self.d))
    }
}

impl PartialOrd for Q {
    fn partial_cmp(&self, o: &Q) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for Q {
    fn eq(&self, o: &Q) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Q {}

// ---------------------------------------------------------------------------
// Token bucket model: tokens as an exact rational at the time of the last
// stored update, refilled continuously and clamped to the capacity.

#[derive(Clone, Copy, Debug)]
struct TbStored {
    params: TokenBucketParams,
    at: u64,
    tokens: Q,
}

#[derive(Clone, Debug, Default)]
struct TbModel {
    stored: Option<TbStored>,
}

impl TbModel {
    /// The tokens a request with `params` sees at `now`, and the time it is
    /// evaluated at.
    fn view(&self, params: TokenBucketParams, now: u64) -> (u64, Q) {
        let capacity = Q::int(params.capacity);
        let Some(s) = self.stored else {
            return (now, capacity);
        };
        let at = now.max(s.at);
        let old = s.params;
        let refill = Q::new(
            u128::from(at - s.at) * u128::from(old.refill_amount),
            u128::from(old.refill_period.0),
        );
        let own = s.tokens.add(refill).min(Q::int(old.capacity));
        let carried = if old.refill_period == params.refill_period {
            own
        } else {
            own.floor_to(u128::from(params.refill_period.0))
        };
        (at, carried.min(capacity))
    }

    fn passes(&self, params: TokenBucketParams, now: u64, cost: u64) -> bool {
        Q::int(cost) <= self.view(params, now).1
    }

    fn is_full(&self, params: TokenBucketParams, now: u64) -> bool {
        self.view(params, now).1 == Q::int(params.capacity)
    }

    fn decide(&mut self, params: TokenBucketParams, now: u64, cost: u64) -> Verdict {
        let (at, tokens) = self.view(params, now);
        let allowed = Q::int(cost) <= tokens;
        let after = if allowed {
            tokens.sub(Q::int(cost))
        } else {
            tokens
        };
        // New parameters are stored even by a denied request (not by a peek).
        let reparametrised = self.stored.is_some_and(|s| s.params != params);
        let stores = cost > 0 && (allowed || reparametrised);
        if stores {
            self.stored = Some(TbStored {
                params,
                at,
                tokens: after,
            });
        }
        Verdict {
            allowed,
            remaining: after.floor(),
            stores,
        }
    }
}

/// A returned token bucket state against the model's stored one: same
/// parameters, time, and level (the model's tokens are whole multiples of
/// 1/period of a token, the unit the code counts in).
fn check_tb_state(next: &TokenBucket, model: &TbModel, ctx: &str) -> Result<(), TestCaseError> {
    let Some(s) = model.stored else {
        return Err(TestCaseError::fail(format!(
            "state returned, the model stored none; {ctx}"
        )));
    };
    let scaled = s.tokens.n * u128::from(s.params.refill_period.0);
    prop_assert_eq!(
        scaled % s.tokens.d,
        0,
        "model tokens {:?}; {}",
        s.tokens,
        ctx
    );
    prop_assert_eq!(next.params, s.params, "stored params; {}", ctx);
    prop_assert_eq!(next.last, Millis(s.at), "stored time; {}", ctx);
    prop_assert_eq!(next.level(), scaled / s.tokens.d, "stored level; {}", ctx);
    Ok(())
}

/// Runs a token bucket against the model. The "when" fields are checked on
/// every step except a peek (cost 0) with parameters other than the stored
/// ones: a peek stores nothing, so the bucket goes on refilling under its old
/// parameters, and what it is told under the new ones is only a forecast.
fn run_token_bucket(
    start: u64,
    initial: TokenBucketParams,
    steps: &[Step<TokenBucketParams>],
) -> Result<(), TestCaseError> {
    let mut model = TbModel::default();
    let mut state: Option<TokenBucket> = None;
    let mut params = initial;
    let mut now = start;
    for (i, step) in steps.iter().enumerate() {
        if let Some(p) = step.change {
            params = p;
        }
        now = advance(now, step.dt);
        let cost = cost_for(step.cost, params.capacity);
        let ctx = format!("step {i}: now={now} cost={cost} {params:?}, state {state:?}");
        let settled = state.is_none_or(|s| s.params == params);

        let (out, next) = token_bucket::decide(state.as_ref(), params, Millis(now), cost);
        let verdict = model.decide(params, now, cost);
        check_outcome(&out, params.capacity, &verdict, next.is_some(), cost, &ctx)?;
        if let Some(next) = &next {
            check_tb_state(next, &model, &ctx)?;
        }

        if next.is_none() {
            // Nothing stored: deciding again is the same decision.
            let again = token_bucket::decide(state.as_ref(), params, Millis(now), cost);
            prop_assert_eq!(again, (out, None), "{}", ctx);
        }
        let after = next.or(state);

        if settled || cost > 0 {
            check_retry(
                &out,
                verdict.allowed,
                cost,
                params.capacity,
                |t| model.passes(params, now + t, cost),
                &ctx,
            )?;
            // The same through the code: with no other traffic, the same
            // request passes at now + retry_after and not a millisecond before.
            let code_passes = |t: u64| {
                token_bucket::decide(after.as_ref(), params, Millis(now + t), cost)
                    .0
                    .allowed
            };
            if let (false, RetryAfter::After(r)) = (out.allowed, out.retry_after) {
                prop_assert!(
                    code_passes(r.0),
                    "code: not allowed at retry_after; {}",
                    ctx
                );
                prop_assert!(
                    !code_passes(r.0 - 1),
                    "code: allowed before retry_after; {}",
                    ctx
                );
            }
        }
        // A full bucket stored ahead of a clock that went back is told
        // reset_after = stored time - now instead of 0: a known bug, see
        // token_bucket_reset_after_of_a_full_bucket_behind_the_clock.
        let full_ahead = model.is_full(params, now) && model.stored.is_some_and(|s| s.at > now);
        if (settled || cost > 0) && !full_ahead {
            check_first(
                "reset_after",
                out.reset_after.0,
                |t| model.is_full(params, now + t),
                &ctx,
            )?;
            // Through the code: the bucket is full again at now + reset_after,
            // and not a millisecond before.
            let code_full = |t: u64| {
                token_bucket::decide(after.as_ref(), params, Millis(now + t), 0)
                    .0
                    .remaining
                    == params.capacity
            };
            let reset = out.reset_after.0;
            prop_assert!(code_full(reset), "code: not full at reset_after; {}", ctx);
            prop_assert!(
                reset == 0 || !code_full(reset - 1),
                "code: full before reset_after; {}",
                ctx
            );
        }
        state = after;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_matches_model(
        start in start(),
        params in tb_params(),
        steps in steps(tb_params(), 0, 60),
    ) {
        run_token_bucket(start, params, &steps)?;
    }

    /// Parameter changes (capacity, rate, period) mid-sequence: `allowed`,
    /// `remaining` and the stored state at every step; the "when" fields on
    /// every step but a peek right after a change.
    #[test]
    fn token_bucket_matches_model_across_parameter_changes(
        start in start(),
        params in tb_params(),
        steps in steps(tb_params(), 15, 60),
    ) {
        run_token_bucket(start, params, &steps)?;
    }

    /// Capacity changes only; `retry_after` and `reset_after` are checked
    /// also right after a change (denied requests included).
    #[test]
    fn token_bucket_when_fields_hold_across_capacity_changes(
        start in start(),
        params in tb_params(),
        capacities in vec(count(), 60),
        steps in steps(Just(()), 15, 60),
    ) {
        let mut current = params;
        let steps: Vec<_> = steps
            .into_iter()
            .zip(capacities)
            .map(|(step, capacity)| {
                if step.change.is_some() {
                    current.capacity = capacity;
                }
                Step { dt: step.dt, cost: step.cost, change: step.change.map(|()| current) }
            })
            .collect();
        run_token_bucket(start, params, &steps)?;
    }

    /// Refill rate changes only (same capacity, same period).
    #[test]
    fn token_bucket_when_fields_hold_across_rate_changes(
        start in start(),
        params in tb_params(),
        amounts in vec(count(), 60),
        steps in steps(Just(()), 15, 60),
    ) {
        let mut current = params;
        let steps: Vec<_> = steps
            .into_iter()
            .zip(amounts)
            .map(|(step, amount)| {
                if step.change.is_some() {
                    current.refill_amount = amount;
                }
                Step { dt: step.dt, cost: step.cost, change: step.change.map(|()| current) }
            })
            .collect();
        run_token_bucket(start, params, &steps)?;
    }

    /// Refill period changes only (same capacity, same amount): tokens are
    /// carried over rounded down to units of 1/new period.
    #[test]
    fn token_bucket_when_fields_hold_across_period_changes(
        start in start(),
        params in tb_params(),
        periods in vec(period(), 60),
        steps in steps(Just(()), 15, 60),
    ) {
        let mut current = params;
        let steps: Vec<_> = steps
            .into_iter()
            .zip(periods)
            .map(|(step, period)| {
                if step.change.is_some() {
                    current.refill_period = Millis(period);
                }
                Step { dt: step.dt, cost: step.cost, change: step.change.map(|()| current) }
            })
            .collect();
        run_token_bucket(start, params, &steps)?;
    }
}

// ---------------------------------------------------------------------------
// Deterministic reproductions of the token bucket findings.

fn tb(capacity: u64, refill_amount: u64, refill_period: u64) -> TokenBucketParams {
    TokenBucketParams {
        capacity,
        refill_amount,
        refill_period: Millis(refill_period),
    }
}

/// A denied request with new parameters: the state it returns holds the new
/// parameters with nothing consumed, and once stored, the same request is
/// allowed at now + retry_after and not a millisecond before.
fn check_denied_change(
    state: Option<TokenBucket>,
    params: TokenBucketParams,
    now: u64,
    cost: u64,
    retry_after: u64,
    level: u128,
) {
    // A peek with the new parameters still stores nothing.
    let (_, peeked) = token_bucket::decide(state.as_ref(), params, Millis(now), 0);
    assert_eq!(peeked, None);
    let (out, next) = token_bucket::decide(state.as_ref(), params, Millis(now), cost);
    assert!(!out.allowed, "{out:?}");
    assert_eq!(out.retry_after, RetryAfter::After(Millis(retry_after)));
    let next = next.expect("a denied request with new parameters stores them");
    assert_eq!(next.params, params);
    assert_eq!(next.last, Millis(now));
    assert_eq!(next.level(), level);
    let at = |t: u64| token_bucket::decide(Some(&next), params, Millis(now + t), cost).0;
    assert!(at(retry_after).allowed, "denied at now + retry_after");
    assert!(!at(retry_after - 1).allowed, "allowed before retry_after");
}

#[test]
fn token_bucket_retry_after_a_rate_increase() {
    let slow = tb(1, 1, 2);
    let fast = tb(1, 2, 2);
    let (_, state) = token_bucket::decide(None, slow, Millis(0), 1);
    // Empty; at 2 tokens per 2 ms, one token is back after 1 ms (at the old
    // rate it would take 2).
    check_denied_change(state, fast, 0, 1, 1, 0);
}

#[test]
fn token_bucket_retry_after_a_capacity_increase() {
    let small = tb(1, 1, 1);
    let large = tb(2, 1, 1);
    let (_, state) = token_bucket::decide(None, small, Millis(0), 1);
    // Empty; 2 tokens take 2 ms, past the old capacity of 1.
    check_denied_change(state, large, 0, 2, 2, 0);
}

#[test]
fn token_bucket_retry_after_a_period_change() {
    let p = tb(2, 1, 3);
    let q = tb(2, 1, 2);
    let (_, state) = token_bucket::decide(None, p, Millis(0), 2);
    // At 2 ms: 2/3 of a token at 1 per 3 ms, rounded down to 1/2 under the
    // new period; 1.5 more tokens at 1 per 2 ms take 3 ms.
    check_denied_change(state, q, 2, 2, 3, 1);
}

/// A denied request with new parameters can store a full bucket (a cost
/// above the new capacity, say). Asked again at an earlier time (a clock that
/// went back), the bucket is full (remaining = capacity), yet reset_after is
/// the stored time minus now rather than 0: `full_at` of a full bucket is its
/// `last`, and `until(last, now)` is positive while now < last.
#[test]
fn token_bucket_reset_after_of_a_full_bucket_behind_the_clock() {
    let p = tb(1, 1, 1);
    let q = tb(1, 2, 1);
    let (_, state) = token_bucket::decide(None, p, Millis(0), 1);
    // At 10 the bucket is full again; a cost above the capacity stores it
    // under the new parameters, full, at 10.
    let (out, next) = token_bucket::decide(state.as_ref(), q, Millis(10), 2);
    assert!(!out.allowed);
    assert_eq!(out.reset_after, Millis(0));
    let next = next.expect("new parameters are stored");
    assert_eq!(next.level(), 1);
    // The clock goes back to 5: a peek sees the bucket full.
    let (peek, _) = token_bucket::decide(Some(&next), q, Millis(5), 0);
    assert_eq!(peek.remaining, q.capacity);
    assert_eq!(peek.reset_after, Millis(0), "{peek:?}");
}
