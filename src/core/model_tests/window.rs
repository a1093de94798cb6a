//! Fixed and sliding windows against their model: a count per window.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{
    advance, check_first, check_outcome, check_retry, config, cost_for, count, period, start,
    steps, Step, Verdict,
};
use crate::core::window::{self, Window, WindowParams};
use crate::core::{Millis, RetryAfter};

// ---------------------------------------------------------------------------
// Window model: a count per epoch-aligned window [k*period, (k+1)*period).

#[derive(Clone, Debug, Default)]
struct WindowModel {
    counts: BTreeMap<u64, u64>,
    /// Start of the window of the latest stored update: the clock never goes
    /// back before it.
    floor: u64,
}

impl WindowModel {
    fn count(&self, k: u64) -> u64 {
        self.counts.get(&k).copied().unwrap_or(0)
    }

    /// Estimate x period: current count, plus the previous window's count
    /// weighted by how much of it is still within the last period.
    fn used_scaled(&self, period: u64, sliding: bool, now: u64) -> u128 {
        let at = now.max(self.floor);
        let k = at / period;
        let elapsed = at % period;
        let current = self.count(k);
        let previous = if sliding && k > 0 {
            self.count(k - 1)
        } else {
            0
        };
        u128::from(current) * u128::from(period)
            + u128::from(previous) * u128::from(period - elapsed)
    }

    /// A peek (cost 0) passes even over a lowered limit: it asks for nothing.
    fn passes(&self, params: WindowParams, sliding: bool, now: u64, cost: u64) -> bool {
        let p = u128::from(params.period.0);
        cost == 0
            || self.used_scaled(params.period.0, sliding, now) + u128::from(cost) * p
                <= u128::from(params.limit) * p
    }

    fn is_empty(&self, period: u64, sliding: bool, now: u64) -> bool {
        self.used_scaled(period, sliding, now) == 0
    }

    fn decide(&mut self, params: WindowParams, sliding: bool, now: u64, cost: u64) -> Verdict {
        let period = params.period.0;
        let allowed = self.passes(params, sliding, now, cost);
        let stores = allowed && cost > 0;
        if stores {
            let at = now.max(self.floor);
            *self.counts.entry(at / period).or_default() += cost;
            self.floor = at - at % period;
        }
        let p = u128::from(period);
        let room =
            (u128::from(params.limit) * p).saturating_sub(self.used_scaled(period, sliding, now));
        Verdict {
            allowed,
            remaining: u64::try_from(room / p).unwrap(),
            stores,
        }
    }
}

fn run_window(
    start: u64,
    limit: u64,
    period: u64,
    sliding: bool,
    steps: &[Step<u64>],
) -> Result<(), TestCaseError> {
    let mut model = WindowModel::default();
    let mut state: Option<Window> = None;
    let mut params = WindowParams {
        limit,
        period: Millis(period),
    };
    let mut now = start;
    for (i, step) in steps.iter().enumerate() {
        if let Some(limit) = step.change {
            params.limit = limit;
        }
        now = advance(now, step.dt);
        let cost = cost_for(step.cost, params.limit);
        let ctx = format!(
            "step {i}: now={now} cost={cost} sliding={sliding} {params:?}, state {state:?}"
        );

        let (out, next) = window::decide(state.as_ref(), params, sliding, Millis(now), cost);
        let verdict = model.decide(params, sliding, now, cost);
        check_outcome(&out, params.limit, &verdict, next.is_some(), cost, &ctx)?;
        if next.is_none() {
            let again = window::decide(state.as_ref(), params, sliding, Millis(now), cost);
            prop_assert_eq!(again, (out, None), "{}", ctx);
        }
        let after = next.or(state);

        check_retry(
            &out,
            verdict.allowed,
            cost,
            params.limit,
            |t| model.passes(params, sliding, now + t, cost),
            &ctx,
        )?;
        check_first(
            "reset_after",
            out.reset_after.0,
            |t| model.is_empty(period, sliding, now + t),
            &ctx,
        )?;
        let code_passes = |t: u64| {
            window::decide(after.as_ref(), params, sliding, Millis(now + t), cost)
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
        let code_full = |t: u64| {
            window::decide(after.as_ref(), params, sliding, Millis(now + t), 0)
                .0
                .remaining
                == params.limit
        };
        let reset = out.reset_after.0;
        prop_assert!(code_full(reset), "code: not empty at reset_after; {}", ctx);
        prop_assert!(
            reset == 0 || !code_full(reset - 1),
            "code: empty before reset_after; {}",
            ctx
        );
        state = after;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fixed_window_matches_model(
        start in start(),
        limit in count(),
        period in period(),
        steps in steps(count(), 10, 60),
    ) {
        run_window(start, limit, period, false, &steps)?;
    }

    #[test]
    fn sliding_window_matches_model(
        start in start(),
        limit in count(),
        period in period(),
        steps in steps(count(), 10, 60),
    ) {
        run_window(start, limit, period, true, &steps)?;
    }
}
