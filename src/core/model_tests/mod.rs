//! Model-based property tests: every algorithm of the core against a naive,
//! obviously-correct reference model (exact rationals, a count per window, a
//! plain vector of logged requests), with the "when" fields of each reply
//! (`retry_after`, `reset_after`) checked by brute force against the model,
//! plus round trips and robustness of the codec.
//!
//! The models assert against their own arithmetic, never against values the
//! code under test computed. Semantics the models share with the code, by
//! design:
//! - A decision that stores nothing changes nothing, not even the parameters
//!   the state was stored with. A peek (cost 0) never stores; a denied request
//!   stores nothing, except in a token bucket whose parameters changed: there
//!   it stores the bucket advanced to `now` under its old parameters, carried
//!   over to the new ones, nothing consumed, so that it goes on refilling
//!   under the parameters its reply was computed with.
//! - A sliding log caps an entry's count at limit + 1 (decision-preserving:
//!   such an entry alone denies every request while it is live); the log
//!   model keeps every request uncapped, so the two are compared by their
//!   decisions, never by raw counts.
//! - A clock that goes back is treated as standing still at the latest stored
//!   update (token bucket, sliding log) or at the start of the stored window.
//! - A token bucket whose refill period changes keeps its tokens rounded down
//!   to whole units of 1/new_period of a token (documented in token_bucket.rs).

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

use super::codec::{encode_effect, encode_limiter};
use super::limiter::{Effect, Limiter};
use super::token_bucket::TokenBucketParams;
use super::{varint, Millis, Outcome, RetryAfter};

mod closure;
mod codec;
mod gcra;
mod large_counts;
mod lease;
mod sliding_log;
mod token_bucket;
mod window;

fn config() -> Config {
    Config {
        cases: 256,
        // Keep the source tree untouched: no proptest-regressions files.
        failure_persistence: None,
        ..Config::default()
    }
}

/// For the decode fuzzers: RL_FUZZ_CASES cases (`make fuzz`), else the default.
fn fuzz_config() -> Config {
    let cases = std::env::var("RL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(config().cases);
    Config { cases, ..config() }
}

// ---------------------------------------------------------------------------
// Shared generators and checks.

/// One request: time step (may go back), a cost seed, maybe new parameters.
#[derive(Clone, Debug)]
struct Step<P> {
    dt: i64,
    cost: u64,
    change: Option<P>,
}

fn dt() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        4 => 1..20i64,
        4 => 0..3000i64,
        1 => -3000..0i64,
    ]
}

/// Steps, each changing the parameters with `change_percent` % probability.
fn steps<P: Clone + std::fmt::Debug>(
    change: impl Strategy<Value = P>,
    change_percent: u32,
    max_len: usize,
) -> impl Strategy<Value = Vec<Step<P>>> {
    let step =
        (dt(), 0..=22u64, 0..100u32, change).prop_map(move |(dt, cost, roll, change)| Step {
            dt,
            cost,
            change: (roll < change_percent).then_some(change),
        });
    vec(step, 1..=max_len)
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![0..10_000u64, 1_700_000_000_000u64..1_700_100_000_000]
}

fn period() -> impl Strategy<Value = u64> {
    prop_oneof![1..=10u64, 1..=2000u64]
}

fn count() -> impl Strategy<Value = u64> {
    1..=20u64
}

fn tb_params() -> impl Strategy<Value = TokenBucketParams> {
    (count(), count(), period()).prop_map(|(capacity, refill_amount, p)| TokenBucketParams {
        capacity,
        refill_amount,
        refill_period: Millis(p),
    })
}

fn advance(now: u64, dt: i64) -> u64 {
    now.saturating_add_signed(dt)
}

/// Costs from 0 to limit + 2.
fn cost_for(seed: u64, limit: u64) -> u64 {
    seed % (limit + 3)
}

/// `first` claims to be the smallest offset t >= 0 at which `holds(t)`:
/// it holds there, not one millisecond earlier, and not at any offset before
/// (brute force, sampled to at most ~200 probes on long ranges; every model
/// predicate used here is monotone in t).
fn check_first(
    what: &str,
    first: u64,
    holds: impl Fn(u64) -> bool,
    ctx: &str,
) -> Result<(), TestCaseError> {
    prop_assert!(
        holds(first),
        "{what} = {first}, but the model does not agree then; {ctx}"
    );
    if first > 0 {
        prop_assert!(
            !holds(first - 1),
            "{what} = {first}, but the model already agrees at {}; {ctx}",
            first - 1
        );
    }
    let stride = (first / 200).max(1);
    let mut t = 0;
    while t < first {
        prop_assert!(
            !holds(t),
            "{what} = {first}, but the model already agrees at {t}; {ctx}"
        );
        t += stride;
    }
    Ok(())
}

/// `retry_after` against the model: 0 when allowed, Never when the cost can
/// never fit, otherwise the first moment the same request would pass.
fn check_retry(
    out: &Outcome,
    allowed: bool,
    cost: u64,
    max: u64,
    passes_at: impl Fn(u64) -> bool,
    ctx: &str,
) -> Result<(), TestCaseError> {
    if cost > max {
        prop_assert_eq!(out.retry_after, RetryAfter::Never, "{}", ctx);
    } else if allowed {
        prop_assert_eq!(out.retry_after, RetryAfter::After(Millis::ZERO), "{}", ctx);
    } else {
        match out.retry_after {
            RetryAfter::After(r) => check_first("retry_after", r.0, passes_at, ctx)?,
            RetryAfter::Never => prop_assert!(false, "retry_after Never; {}", ctx),
        }
    }
    Ok(())
}

/// What the model says about one request.
struct Verdict {
    allowed: bool,
    remaining: u64,
    /// Whether the request changes the stored state.
    stores: bool,
}

fn check_outcome(
    out: &Outcome,
    limit: u64,
    verdict: &Verdict,
    stored: bool,
    cost: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(out.limit, limit, "limit; {}", ctx);
    prop_assert_eq!(out.allowed, verdict.allowed, "allowed; {}", ctx);
    prop_assert_eq!(out.remaining, verdict.remaining, "remaining; {}", ctx);
    prop_assert_eq!(stored, verdict.stores, "new state returned; {}", ctx);
    if cost == 0 {
        prop_assert!(!stored, "cost 0 returned a new state; {}", ctx);
        // The peek contract, whatever the state and the parameters.
        prop_assert!(out.allowed, "a peek was denied; {}", ctx);
        prop_assert_eq!(
            out.retry_after,
            RetryAfter::After(Millis::ZERO),
            "peek retry; {}",
            ctx
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Codec helpers shared by the codec, sliding log and large count tests.

fn encoded(limiter: &Limiter) -> Vec<u8> {
    let mut out = Vec::new();
    encode_limiter(limiter, &mut out);
    out
}

fn encoded_effect(effect: &Effect) -> Vec<u8> {
    let mut out = Vec::new();
    encode_effect(effect, &mut out);
    out
}

/// Equal as limiters: a sliding log compares by what it holds (parameters,
/// last update, entries), not by the layout of its buffer.
fn same_limiter(a: &Limiter, b: &Limiter) -> bool {
    match (a, b) {
        (Limiter::Locked(x), Limiter::Locked(y)) => {
            x.until == y.until && same_limiter(&x.inner, &y.inner)
        }
        (Limiter::SlidingLog(x), Limiter::SlidingLog(y)) => {
            x.params == y.params
                && x.last_update() == y.last_update()
                && x.total() == y.total()
                && x.entries().eq(y.entries())
        }
        _ => a == b,
    }
}

/// A sliding log's header: version, kind, limit, period, last, entry count;
/// the entries follow as (gap, count) varint pairs.
const LOG_HEADER: usize = 2 + 4 * 8;

/// A sliding log's encoding built by hand: header fields, then `entry_count`,
/// then `entries` as (gap, count) varints, the first gap absolute.
fn log_bytes(
    limit: u64,
    period: u64,
    last: u64,
    entry_count: u64,
    entries: impl IntoIterator<Item = (u64, u64)>,
) -> Vec<u8> {
    let mut bytes = vec![1, 4];
    for word in [limit, period, last, entry_count] {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    for (gap, count) in entries {
        varint::push(&mut bytes, gap);
        varint::push(&mut bytes, count);
    }
    bytes
}

/// Uses a decoded limiter: no decision on it may panic.
fn exercise(limiter: &Limiter) {
    for now in [0, 1, 1_000, 1_700_000_000_000, u64::MAX / 2, u64::MAX] {
        for cost in [0, 1, 2, 1_000_000_000_000_000] {
            let now = Millis(now);
            match limiter {
                Limiter::TokenBucket(b) => {
                    let _ = crate::core::token_bucket::decide(Some(b), b.params, now, cost);
                }
                Limiter::FixedWindow(w) => {
                    let _ = crate::core::window::decide(Some(w), w.params, false, now, cost);
                }
                Limiter::SlidingWindow(w) => {
                    let _ = crate::core::window::decide(Some(w), w.params, true, now, cost);
                }
                Limiter::Locked(locked) => exercise(&locked.inner),
                Limiter::Lease(l) => {
                    let params = crate::core::lease::LeaseParams {
                        limit: l.limit,
                        ttl: Millis(1000),
                    };
                    let cost = cost.min(crate::core::lease::MAX_LEASE_LIMIT);
                    let (_, granted) = crate::core::lease::decide(Some(l), params, now, cost);
                    if let Some((at, lease)) = granted {
                        let mut copy = (**l).clone();
                        let id = crate::core::lease::LeaseId(7);
                        copy.apply(crate::core::lease::grant(params, at, lease, id));
                    }
                }
                Limiter::CalendarWindow(w) => {
                    let _ = crate::core::calendar_window::decide(Some(w), w.params, now, cost);
                }
                Limiter::Gcra(g) => {
                    let (verdict, _) = crate::core::gcra::decide(Some(g), g.params(), now, cost);
                    let _ = (verdict.outcome(), verdict.redis_cell_reply());
                }
                Limiter::SlidingLog(log) => {
                    for count_denied in [false, true] {
                        let (_, record) = crate::core::sliding_log::decide(
                            Some(log),
                            log.params,
                            now,
                            cost,
                            count_denied,
                        );
                        if let Some(record) = record {
                            let mut copy = (**log).clone();
                            copy.apply(record);
                        }
                    }
                }
            }
            let _ = limiter.expires_at();
            let _ = limiter.peek(now);
            let (effect, _) = limiter.refund(now, cost.max(1));
            let _ = limiter.with_effect(effect);
        }
    }
}
