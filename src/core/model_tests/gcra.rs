//! GCRA against its model: the continuous-state leaky bucket of ITU-T I.371
//! (a level X of schedule debt in nanoseconds, drained by the clock since the
//! last conforming request), a formulation independent of the TAT the code
//! keeps. Parameter changes keep the debt, as the code keeps its TAT.

use proptest::prelude::*;

use super::{
    advance, check_first, check_outcome, check_retry, config, cost_for, count, period, start,
    steps, Step, Verdict,
};
use crate::core::gcra::{self, Gcra, GcraParams, Interval};
use crate::core::{Millis, RetryAfter};

const NS: u128 = 1_000_000;

/// T in nanoseconds, as the README specifies it: period / rate rounded up
/// (RL.GCRA) or down (CL.THROTTLE, as redis-cell).
fn interval(p: GcraParams) -> u128 {
    let period_ns = u128::from(p.period.0) * NS;
    let rate = u128::from(p.rate);
    let t = match p.interval {
        Interval::RoundUp => period_ns.div_ceil(rate),
        Interval::RedisCell => period_ns / rate,
    };
    t.max(1)
}

#[derive(Clone, Copy, Debug)]
struct Stored {
    params: GcraParams,
    /// Debt just after the last conforming request, and when that was (ns).
    level: u128,
    at: u128,
}

#[derive(Clone, Debug, Default)]
struct GcraModel {
    stored: Option<Stored>,
}

impl GcraModel {
    /// Debt at `now` ms. A clock behind the last update sees the debt grow
    /// by the difference: going back never drains it.
    fn debt(&self, now: u64) -> u128 {
        let now = u128::from(now) * NS;
        match self.stored {
            None => 0,
            Some(s) if now >= s.at => s.level.saturating_sub(now - s.at),
            Some(s) => s.level + (s.at - now),
        }
    }

    fn conforms(&self, p: GcraParams, now: u64, cost: u64) -> bool {
        let t = interval(p);
        cost <= p.limit && self.debt(now) + u128::from(cost) * t <= u128::from(p.limit) * t
    }

    fn remaining_after(&self, p: GcraParams, debt: u128) -> u64 {
        let t = interval(p);
        let room = (u128::from(p.limit) * t).saturating_sub(debt);
        u64::try_from(room / t).unwrap().min(p.limit)
    }

    fn decide(&mut self, p: GcraParams, now: u64, cost: u64) -> Verdict {
        let conforms = self.conforms(p, now, cost);
        let debt = self.debt(now);
        let admitted = conforms && cost > 0;
        let reparametrised = self.stored.is_some_and(|s| s.params != p);
        let stores = admitted || (cost > 0 && reparametrised);
        let after = if admitted {
            debt + u128::from(cost) * interval(p)
        } else {
            debt
        };
        if stores {
            let at = u128::from(now) * NS;
            self.stored = Some(match self.stored {
                // Denied with new parameters: the same debt under them.
                Some(s) if !admitted => Stored { params: p, ..s },
                _ => Stored {
                    params: p,
                    level: after,
                    at,
                },
            });
        }
        Verdict {
            allowed: conforms || cost == 0,
            remaining: self.remaining_after(p, after),
            stores,
        }
    }
}

/// redis-cell's rounding: whole seconds, plus one for a remainder of at
/// least one millisecond.
fn cell_seconds(ns: u128) -> i64 {
    (ns / 1_000_000_000 + u128::from(ns % 1_000_000_000 >= NS)) as i64
}

fn run_gcra(
    start: u64,
    initial: GcraParams,
    steps: &[Step<GcraParams>],
) -> Result<(), TestCaseError> {
    let mut model = GcraModel::default();
    let mut state: Option<Gcra> = None;
    let mut params = initial;
    let mut now = start;
    for (i, step) in steps.iter().enumerate() {
        if let Some(p) = step.change {
            params = p;
        }
        now = advance(now, step.dt);
        let cost = cost_for(step.cost, params.limit);
        let ctx = format!("step {i}: now={now} cost={cost} {params:?}, state {state:?}");

        let debt_before = model.debt(now);
        let conforms = model.conforms(params, now, cost);
        let (verdict, next) = gcra::decide(state.as_ref(), params, Millis(now), cost);
        let out = verdict.outcome();
        let expected = model.decide(params, now, cost);
        check_outcome(&out, params.limit, &expected, next.is_some(), cost, &ctx)?;
        prop_assert_eq!(verdict.conforms, conforms, "conforms; {}", ctx);
        if let Some(next) = &next {
            prop_assert_eq!(next.params(), params, "stored params; {}", ctx);
        }
        let after = next.or(state);

        // Retry: the same request passes then, with no other traffic.
        check_retry(
            &out,
            out.allowed,
            cost,
            params.limit,
            |t| model.conforms(params, now + t, cost),
            &ctx,
        )?;
        // Reset: the debt is gone then, and not a millisecond before.
        check_first(
            "reset_after",
            out.reset_after.0,
            |t| model.debt(now + t) == 0,
            &ctx,
        )?;
        // The key expires exactly when the limiter is full again.
        if let Some(s) = after {
            let full = |t: u64| model.debt(t) == 0;
            let expiry = s.full_at().0;
            prop_assert!(full(expiry), "not full at its expiry; {}", ctx);
            prop_assert!(
                expiry <= now || !full(expiry - 1),
                "full before its expiry; {}",
                ctx
            );
        }

        if params.interval == Interval::RedisCell {
            let reply = verdict.redis_cell_reply();
            let t = interval(params);
            let tolerance = u128::from(params.limit) * t;
            prop_assert_eq!(reply[0], i64::from(!conforms), "limited; {}", ctx);
            prop_assert_eq!(reply[1], params.limit as i64, "limit; {}", ctx);
            let wait = debt_before + u128::from(cost) * t;
            let retry = if conforms || cost > params.limit {
                -1
            } else {
                cell_seconds(wait - tolerance)
            };
            prop_assert_eq!(reply[3], retry, "retry_after_s; {}", ctx);
            let debt_after = model.debt(now);
            prop_assert_eq!(reply[4], cell_seconds(debt_after), "reset_after_s; {}", ctx);
            if t.is_multiple_of(1000) {
                // On whole microseconds redis-cell's remaining is the plain quotient.
                let remaining = tolerance.saturating_sub(debt_after) / t;
                prop_assert_eq!(reply[2], remaining as i64, "remaining; {}", ctx);
            }
        }
        state = after;
    }
    Ok(())
}

fn params(interval: Interval) -> impl Strategy<Value = GcraParams> {
    (count(), count(), period()).prop_map(move |(limit, rate, p)| GcraParams {
        limit,
        rate,
        period: Millis(p),
        interval,
    })
}

/// Rates from one per period to one per nanosecond, limits up to 10^15.
fn wide_params() -> impl Strategy<Value = GcraParams> {
    (1..=1_000_000_000_000_000u64, 1..=2000u64, 0..=1u8).prop_flat_map(|(limit, p, cell)| {
        (1..=p * 1_000_000).prop_map(move |rate| GcraParams {
            limit,
            rate,
            period: Millis(p),
            interval: if cell == 0 {
                Interval::RoundUp
            } else {
                Interval::RedisCell
            },
        })
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gcra_matches_model(
        start in start(),
        initial in params(Interval::RoundUp),
        steps in steps(params(Interval::RoundUp), 0, 60),
    ) {
        run_gcra(start, initial, &steps)?;
    }

    #[test]
    fn gcra_matches_model_across_parameter_changes(
        start in start(),
        initial in params(Interval::RoundUp),
        steps in steps(params(Interval::RoundUp), 15, 60),
    ) {
        run_gcra(start, initial, &steps)?;
    }

    /// CL.THROTTLE's interval and reply, against the model and redis-cell's
    /// documented rounding.
    #[test]
    fn redis_cell_interval_matches_model(
        start in start(),
        initial in params(Interval::RedisCell),
        steps in steps(params(Interval::RedisCell), 10, 60),
    ) {
        run_gcra(start, initial, &steps)?;
    }

    /// Extreme rates and bursts: no overflow, the same decisions.
    #[test]
    fn gcra_wide_parameters(
        start in start(),
        p in wide_params(),
        costs in proptest::collection::vec((0..=3u64, 0..4000i64), 1..30),
    ) {
        let mut model = GcraModel::default();
        let mut state = None;
        let mut now = start;
        for (seed, dt) in costs {
            now = advance(now, dt);
            let cost = [0, 1, p.limit / 2, p.limit][seed as usize];
            let (verdict, next) = gcra::decide(state.as_ref(), p, Millis(now), cost);
            let expected = model.decide(p, now, cost);
            prop_assert_eq!(verdict.outcome().allowed, expected.allowed);
            prop_assert_eq!(verdict.outcome().remaining, expected.remaining);
            if let (false, RetryAfter::After(r)) = (verdict.outcome().allowed, verdict.outcome().retry_after) {
                prop_assert!(model.conforms(p, now + r.0, cost));
            }
            state = next.or(state);
        }
    }
}
