//! Sliding log against its model (a plain vector of logged requests), its
//! replication through records, and records applied in any order.

use proptest::collection::vec;
use proptest::prelude::*;

use super::{
    advance, check_first, check_outcome, check_retry, config, cost_for, count, encoded,
    encoded_effect, period, same_limiter, start, steps, Step, Verdict,
};
use crate::core::codec::{decode_effect, decode_limiter};
use crate::core::limiter::{Effect, Limiter};
use crate::core::sliding_log::{self, LogParams, LogRecord, SlidingLog};
use crate::core::{Millis, RetryAfter};

// ---------------------------------------------------------------------------
// Sliding log model: every logged request, forever, in a plain vector.

#[derive(Clone, Debug, Default)]
struct LogModel {
    log: Vec<(u64, u64)>,
    /// Time of the latest logged request: the clock never goes back before it.
    last: u64,
}

impl LogModel {
    fn live(&self, period: u64, now: u64) -> u64 {
        let at = now.max(self.last);
        self.log
            .iter()
            .filter(|(time, _)| time + period > at)
            .map(|(_, cost)| cost)
            .sum()
    }

    /// A peek (cost 0) passes even over a lowered limit: it asks for nothing.
    fn passes(&self, params: LogParams, now: u64, cost: u64) -> bool {
        cost == 0 || cost <= params.limit && self.live(params.period.0, now) + cost <= params.limit
    }

    /// The verdict and, when the request is logged, the time it is logged at.
    fn decide(
        &mut self,
        params: LogParams,
        now: u64,
        cost: u64,
        count_denied: bool,
    ) -> (Verdict, Option<u64>) {
        let allowed = self.passes(params, now, cost);
        let logged = cost > 0 && (allowed || (count_denied && cost <= params.limit));
        let mut at = None;
        if logged {
            let time = now.max(self.last);
            self.log.push((time, cost));
            self.last = time;
            at = Some(time);
        }
        let verdict = Verdict {
            allowed,
            remaining: params.limit.saturating_sub(self.live(params.period.0, now)),
            stores: logged,
        };
        (verdict, at)
    }
}

fn run_log(
    start: u64,
    limit: u64,
    period: u64,
    count_denied: bool,
    steps: &[Step<u64>],
) -> Result<(), TestCaseError> {
    let mut model = LogModel::default();
    let mut state: Option<SlidingLog> = None;
    let mut max_limit = limit;
    let mut params = LogParams {
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
            "step {i}: now={now} cost={cost} count_denied={count_denied} {params:?}, log {:?}",
            state.as_ref().map(|l| l.entries().collect::<Vec<_>>())
        );

        let (out, record) =
            sliding_log::decide(state.as_ref(), params, Millis(now), cost, count_denied);
        let (verdict, logged_at) = model.decide(params, now, cost, count_denied);
        check_outcome(&out, params.limit, &verdict, record.is_some(), cost, &ctx)?;
        prop_assert_eq!(
            record,
            logged_at.map(|at| LogRecord {
                params,
                at: Millis(at),
                cost
            }),
            "{}",
            ctx
        );
        if record.is_none() {
            let again =
                sliding_log::decide(state.as_ref(), params, Millis(now), cost, count_denied);
            prop_assert_eq!(again, (out, None), "{}", ctx);
        }
        if let Some(record) = record {
            state
                .get_or_insert_with(|| SlidingLog::new(params))
                .apply(record);
        }
        max_limit = max_limit.max(params.limit);
        if let Some(log) = &state {
            let entries = log.entries().count() as u64;
            prop_assert!(
                entries <= log.params.limit + 1,
                "{} entries for limit {}; {}",
                entries,
                log.params.limit,
                ctx
            );
            // An entry's count is capped at limit + 1 (the largest limit it
            // was written under), and what is stored can be reloaded.
            prop_assert!(
                log.entries().all(|(_, count)| count <= max_limit + 1),
                "count above the cap; {}",
                ctx
            );
            let limiter = Limiter::SlidingLog(Box::new(log.clone()));
            prop_assert_eq!(decode_limiter(&encoded(&limiter)), Some(limiter), "{}", ctx);
        }

        check_retry(
            &out,
            verdict.allowed,
            cost,
            params.limit,
            |t| model.passes(params, now + t, cost),
            &ctx,
        )?;
        check_first(
            "reset_after",
            out.reset_after.0,
            |t| model.live(period, now + t) == 0,
            &ctx,
        )?;
        let code_passes = |t: u64| {
            sliding_log::decide(state.as_ref(), params, Millis(now + t), cost, false)
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
        let code_empty = |t: u64| {
            sliding_log::decide(state.as_ref(), params, Millis(now + t), 0, false)
                .0
                .remaining
                == params.limit
        };
        let reset = out.reset_after.0;
        prop_assert!(code_empty(reset), "code: not empty at reset_after; {}", ctx);
        prop_assert!(
            reset == 0 || !code_empty(reset - 1),
            "code: empty before reset_after; {}",
            ctx
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// Only allowed requests logged; the limit may change mid-sequence.
    #[test]
    fn sliding_log_matches_model(
        start in start(),
        limit in count(),
        period in period(),
        steps in steps(count(), 10, 60),
    ) {
        run_log(start, limit, period, false, &steps)?;
    }

    /// COUNTDENIED with fixed parameters: the pruned log decides exactly like
    /// the full one, and never holds more than limit + 1 entries.
    #[test]
    fn sliding_log_count_denied_matches_model(
        start in start(),
        limit in count(),
        period in period(),
        steps in steps(count(), 0, 60),
    ) {
        run_log(start, limit, period, true, &steps)?;
    }

    /// A client hammering with COUNTDENIED: many requests a millisecond apart
    /// or in the same millisecond, over long periods.
    #[test]
    fn sliding_log_count_denied_memory_stays_bounded(
        start in start(),
        limit in count(),
        period in 100..=2000u64,
        steps in vec((prop_oneof![Just(0i64), 1..5i64], 1..=22u64), 1..=200),
    ) {
        let steps: Vec<Step<u64>> = steps
            .into_iter()
            .map(|(dt, cost)| Step { dt, cost, change: None })
            .collect();
        run_log(start, limit, period, true, &steps)?;
    }

    /// Replication and persistence of a sliding log: a replica that applies
    /// the primary's records (sent through the effect codec), reloaded from
    /// an RDB-style encoding at some point, holds exactly the primary's log,
    /// byte for byte, after every record; so does a third log that applied
    /// every record from the start.
    #[test]
    fn sliding_log_records_replicate_exactly(
        start in start(),
        limit in count(),
        period in period(),
        count_denied in any::<bool>(),
        steps in steps(Just(()), 0, 60),
        reload_at in any::<prop::sample::Index>(),
    ) {
        let params = LogParams { limit, period: Millis(period) };
        let mut primary = SlidingLog::new(params);
        let mut replica = SlidingLog::new(params);
        let mut twin = SlidingLog::new(params);
        let reload_at = reload_at.index(steps.len());
        let mut now = start;
        for (i, step) in steps.iter().enumerate() {
            now = advance(now, step.dt);
            let cost = cost_for(step.cost, limit);
            if i == reload_at {
                let decoded = decode_limiter(&encoded(&Limiter::SlidingLog(Box::new(replica.clone()))));
                let Some(Limiter::SlidingLog(decoded)) = decoded else {
                    return Err(TestCaseError::fail(format!("replica did not decode: {decoded:?}")));
                };
                replica = *decoded;
            }
            let (_, record) = sliding_log::decide(Some(&primary), params, Millis(now), cost, count_denied);
            let Some(record) = record else { continue };
            primary.apply(record);
            twin.apply(record);
            match decode_effect(&encoded_effect(&Effect::LogRecord(record))) {
                Some(Effect::LogRecord(sent)) => replica.apply(sent),
                other => return Err(TestCaseError::fail(format!("{record:?} decoded as {other:?}"))),
            }
            let primary_bytes = encoded(&Limiter::SlidingLog(Box::new(primary.clone())));
            let replica_bytes = encoded(&Limiter::SlidingLog(Box::new(replica.clone())));
            let twin_bytes = encoded(&Limiter::SlidingLog(Box::new(twin.clone())));
            prop_assert_eq!(&primary_bytes, &replica_bytes, "step {}", i);
            prop_assert_eq!(&primary_bytes, &twin_bytes, "step {}", i);
            prop_assert_eq!(primary.total(), replica.total(), "step {}", i);
        }
    }
}

fn log_record() -> impl Strategy<Value = LogRecord> {
    (count(), period(), 0..5000u64, 1..=25u64).prop_map(|(limit, period, at, cost)| LogRecord {
        params: LogParams {
            limit,
            period: Millis(period),
        },
        at: Millis(at),
        cost,
    })
}

proptest! {
    #![proptest_config(config())]

    /// Records as a replication stream or an AOF could carry them, in any
    /// order, with any parameters: the log stays one this code can encode,
    /// decode and use (entries strictly increasing, bounded, last update the
    /// newest entry's time), and records never make time go back.
    #[test]
    fn sliding_log_applies_any_records(records in vec(log_record(), 1..60)) {
        let mut log = SlidingLog::new(records[0].params);
        let mut latest = 0;
        for record in records {
            log.apply(record);
            latest = latest.max(record.at.0);
            let entries: Vec<_> = log.entries().collect();
            let ctx = format!("after {record:?}: {entries:?}");
            prop_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "{}", ctx);
            prop_assert_eq!(entries.last().map(|e| e.0), Some(Millis(latest)), "{}", ctx);
            prop_assert_eq!(log.last_update(), Millis(latest), "{}", ctx);
            prop_assert_eq!(log.total(), entries.iter().map(|e| e.1).sum::<u64>(), "{}", ctx);
            prop_assert!(entries.len() as u64 <= log.params.limit + 1, "{}", ctx);
            let limiter = Limiter::SlidingLog(Box::new(log.clone()));
            let decoded = decode_limiter(&encoded(&limiter));
            prop_assert!(decoded.is_some_and(|d| same_limiter(&d, &limiter)), "{}", ctx);
        }
    }
}
