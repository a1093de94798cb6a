//! GCRA, the generic cell rate algorithm (virtual scheduling form): `rate`
//! requests per `period` on an evenly spaced schedule, with a burst
//! tolerance of `limit` requests. The whole state is one time point, the
//! theoretical arrival time (TAT): when the schedule would be caught up.
//!
//! With emission interval T = period / rate and tolerance tau = limit x T, a
//! request of `cost` at `now` conforms when
//! `max(TAT, now) + cost x T <= now + tau`; it then moves the TAT to the
//! left-hand side. Admission is the same as a token bucket of `limit` tokens
//! refilled at `rate` per `period`: `limit - (TAT - now) / T` tokens are there.
//!
//! Exactness: time is counted in nanoseconds, and T is a whole number of
//! them. When `period / rate` is one (any rate up to 10^9 per second that
//! divides the period, one request per 3650 days included), every figure is
//! exact. Otherwise T is rounded up to the next nanosecond: a burst is still
//! exactly `limit` requests, never more than the rate is admitted, and the
//! sustained rate is at most 1 ns per request slower (3 per second: one
//! request every 333,333,334 ns).
//!
//! redis-cell compatibility (`CL.THROTTLE`): redis-cell rounds the emission
//! interval itself down to whole nanoseconds and derives tau from that;
//! `Interval::RedisCell` does the same so its replies match to the second.

use super::bounds::clock;
use super::time::{Nanos, NANOS_PER_MILLI};
use super::{Millis, Outcome, RetryAfter, MAX_TIME};

/// The TAT is stored in 96 bits; tolerances up to 2^94 ns (about 627 billion
/// years) keep `now + tau` far below that for any clock a u64 of
/// milliseconds can show.
pub const MAX_TOLERANCE: Nanos = Nanos(1 << 94);
/// The latest TAT a request can set: an admitted request moves the TAT to
/// at most `now + tau`, with the clock at most `MAX_TIME`. A change of
/// parameters keeps the TAT, so the bound is the largest tolerance's.
const MAX_TAT: u128 = MAX_TIME.0 as u128 * NANOS_PER_MILLI + MAX_TOLERANCE.0;

/// How the emission interval `period / rate` is rounded to nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Interval {
    /// Up: never more than the rate (RL.GCRA, RL.THROTTLE).
    RoundUp = 0,
    /// Down, as redis-cell does (CL.THROTTLE), for identical replies.
    RedisCell = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraParams {
    /// Requests that can pass at once on a fresh limiter (`burst`, or
    /// redis-cell's `max_burst + 1`).
    pub limit: u64,
    pub rate: u64,
    pub period: Millis,
    pub interval: Interval,
}

/// Why parameters cannot make a limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamError {
    /// More than one request per nanosecond.
    RateTooHigh,
    /// `limit x period / rate` beyond [`MAX_TOLERANCE`].
    ToleranceTooLong,
}

impl GcraParams {
    fn period_ns(&self) -> u128 {
        Nanos::from_millis(self.period).0
    }

    /// T, the emission interval in nanoseconds (at least 1).
    fn interval_ns(&self) -> u128 {
        let rate = u128::from(self.rate.max(1));
        let interval = match self.interval {
            Interval::RoundUp => self.period_ns().div_ceil(rate),
            Interval::RedisCell => self.period_ns() / rate,
        };
        interval.max(1)
    }

    /// Nanoseconds of schedule that `count` requests take.
    fn share(&self, count: u64) -> u128 {
        u128::from(count) * self.interval_ns()
    }

    /// tau: how far the TAT may run ahead of the clock.
    pub fn tolerance(&self) -> Nanos {
        Nanos(self.share(self.limit))
    }

    /// Whole requests whose shares fit in `room` ns.
    fn requests_in(&self, room: u128) -> u64 {
        let k = room / self.interval_ns();
        u64::try_from(k.min(u128::from(self.limit))).unwrap_or(self.limit)
    }

    pub fn check(&self) -> Result<(), ParamError> {
        if u128::from(self.rate) > self.period_ns() {
            return Err(ParamError::RateTooHigh);
        }
        if self.tolerance() > MAX_TOLERANCE {
            return Err(ParamError::ToleranceTooLong);
        }
        Ok(())
    }
}

/// The stored state: parameters (for RL.PEEK and parameter changes) and the
/// TAT. Flat rather than holding a `GcraParams` (whose padding would cost a
/// word), so every limiter stays one 48-byte allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gcra {
    limit: u64,
    rate: u64,
    period: Millis,
    tat_lo: u64,
    tat_hi: u32,
    interval: Interval,
}

impl Gcra {
    fn new(params: GcraParams, tat: Nanos) -> Gcra {
        let tat = tat.0.min(MAX_TAT);
        Gcra {
            limit: params.limit,
            rate: params.rate,
            period: params.period,
            tat_lo: tat as u64,
            tat_hi: (tat >> 64) as u32,
            interval: params.interval,
        }
    }

    pub fn params(&self) -> GcraParams {
        GcraParams {
            limit: self.limit,
            rate: self.rate,
            period: self.period,
            interval: self.interval,
        }
    }

    pub fn tat(&self) -> Nanos {
        Nanos((u128::from(self.tat_hi) << 64) | u128::from(self.tat_lo))
    }

    /// A state loaded from outside (RDB, RESTORE, replication) is only
    /// accepted when this code could have produced it.
    pub fn restored(params: GcraParams, tat: Nanos) -> Option<Gcra> {
        (params.check().is_ok() && tat.0 <= MAX_TAT).then(|| Gcra::new(params, tat))
    }

    /// This limiter with its TAT moved up to `floor` if it was earlier.
    pub fn with_tat_at_least(&self, floor: Nanos) -> Gcra {
        Gcra::new(self.params(), self.tat().max(floor))
    }

    /// The moment the schedule is caught up (the limiter is full): its key
    /// expires then.
    pub fn full_at(&self) -> Millis {
        self.tat().ceil_millis()
    }
}

/// A decision in nanoseconds, before it is rounded into a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub params: GcraParams,
    pub cost: u64,
    /// Whether the request fits in the tolerance. A peek (cost 0) conforms
    /// unless the TAT is already beyond a (lowered) tolerance.
    pub conforms: bool,
    /// TAT - now after the request (before it, when it did not conform).
    pub ahead: Nanos,
    /// When it did not conform: the wait until it would, or None when it
    /// never can (`cost > limit`).
    pub wait: Option<Nanos>,
}

/// Decides a request of `cost` at `now`. Returns the verdict and, when the
/// request changes the state (it was admitted with a cost, or it changed the
/// parameters), the new state. A peek never changes it.
pub fn decide(
    state: Option<&Gcra>,
    params: GcraParams,
    now: Millis,
    cost: u64,
) -> (Verdict, Option<Gcra>) {
    let now = Nanos::from_millis(clock(now));
    // A clock that went back leaves the TAT where it is: further ahead.
    let tat = state.map_or(now, |s| s.tat()).max(now);
    let ahead = tat.saturating_sub(now).0;
    let tolerance = params.tolerance().0;
    let share = params.share(cost);
    let conforms = ahead.saturating_add(share) <= tolerance;
    let wait = match (conforms, cost <= params.limit) {
        (true, _) => None,
        (false, false) => None,
        (false, true) => Some(Nanos(ahead + share - tolerance)),
    };
    let admitted = conforms && cost > 0;
    let tat_after = if admitted { Nanos(tat.0 + share) } else { tat };
    let verdict = Verdict {
        params,
        cost,
        conforms,
        ahead: tat_after.saturating_sub(now),
        wait,
    };
    // New parameters are stored even by a denied request (as a token
    // bucket does), so RL.PEEK reports the ones the reply was computed under.
    let reparametrised = state.is_some_and(|s| s.params() != params);
    let next = match state {
        _ if admitted => Some(Gcra::new(params, tat_after)),
        Some(s) if cost > 0 && reparametrised => Some(Gcra::new(params, s.tat())),
        _ => None,
    };
    (verdict, next)
}

/// Gives back up to `amount` requests at `now`: the TAT moves back by
/// `amount x T`, never behind `now` (a full limiter holds no more). Returns
/// the new state and the requests given back (a fraction of T counts as one).
pub fn refund(state: &Gcra, now: Millis, amount: u64) -> (Gcra, u64) {
    let params = state.params();
    let now = Nanos::from_millis(clock(now));
    let tat = state.tat().max(now);
    let back = params.share(amount).min(tat.0 - now.0);
    let given = u64::try_from(back.div_ceil(params.interval_ns())).unwrap_or(amount);
    (Gcra::new(params, Nanos(tat.0 - back)), given.min(amount))
}

impl Verdict {
    /// The standard five fields. A peek is always `allowed` (it asks for
    /// nothing); the other fields still show how far over a lowered limit the
    /// limiter is.
    pub fn outcome(&self) -> Outcome {
        let allowed = self.conforms || self.cost == 0;
        let tolerance = self.params.tolerance().0;
        Outcome {
            allowed,
            limit: self.params.limit,
            remaining: self
                .params
                .requests_in(tolerance.saturating_sub(self.ahead.0)),
            retry_after: match (allowed, self.wait) {
                (true, _) => RetryAfter::After(Millis::ZERO),
                (false, Some(wait)) => RetryAfter::After(wait.ceil_millis()),
                (false, None) => RetryAfter::Never,
            },
            reset_after: self.ahead.ceil_millis(),
        }
    }

    /// redis-cell's reply: `[limited, limit, remaining, retry_after_s,
    /// reset_after_s]`, with its rounding (see [`cell_seconds`]) and its
    /// remaining, computed on microseconds. Only where redis-cell's own
    /// arithmetic breaks (an interval under 1 us, where it divides by zero)
    /// is it computed on nanoseconds.
    pub fn redis_cell_reply(&self) -> [i64; 5] {
        let tolerance = self.params.tolerance().0;
        let interval = self.params.interval_ns();
        let next = tolerance.saturating_sub(self.ahead.0);
        let remaining = if interval >= 1000 {
            (next / 1000) / (interval / 1000)
        } else {
            next / interval
        };
        let retry_after = match (self.conforms, self.wait) {
            (false, Some(wait)) => cell_seconds(wait),
            _ => -1,
        };
        [
            i64::from(!self.conforms),
            self.params.limit as i64,
            i64::try_from(remaining).unwrap_or(i64::MAX),
            retry_after,
            cell_seconds(self.ahead),
        ]
    }
}

/// CL.THROTTLE's reply for a key locked out (a lock set by RL.GCRA ...
/// LOCKOUT, which redis-cell has no notion of): limited, nothing remaining,
/// retry when the lock ends; a peek (quantity 0) is not limited.
pub fn locked_cell_reply(outcome: &Outcome, cost: u64) -> [i64; 5] {
    let seconds = |ms: Millis| cell_seconds(Nanos::from_millis(ms));
    let retry = match outcome.retry_after {
        RetryAfter::After(wait) if cost > 0 => seconds(wait),
        _ => -1,
    };
    [
        i64::from(cost > 0),
        outcome.limit as i64,
        0,
        retry,
        seconds(outcome.reset_after),
    ]
}

/// redis-cell's rounding of a duration to seconds: whole seconds, plus one
/// when the remainder holds at least a whole millisecond (a remainder below
/// 1 ms is dropped).
pub fn cell_seconds(duration: Nanos) -> i64 {
    let seconds = duration.0 / (1000 * NANOS_PER_MILLI);
    let millis = duration.0 % (1000 * NANOS_PER_MILLI) / NANOS_PER_MILLI;
    i64::try_from(seconds + u128::from(millis > 0)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(limit: u64, rate: u64, period_ms: u64) -> GcraParams {
        GcraParams {
            limit,
            rate,
            period: Millis(period_ms),
            interval: Interval::RoundUp,
        }
    }

    fn cell(max_burst: u64, rate: u64, period_s: u64) -> GcraParams {
        GcraParams {
            limit: max_burst + 1,
            rate,
            period: Millis(period_s * 1000),
            interval: Interval::RedisCell,
        }
    }

    /// redis-cell's own table (src/cell/mod.rs, `it_rate_limits`): limit 5,
    /// one per second; (ms from start, quantity, remaining, reset_after ms,
    /// retry_after ms or -1, limited).
    #[test]
    fn redis_cell_reference_table() {
        let p = cell(4, 1, 1);
        let start = 1_700_000_000_000u64;
        let cases: [(u64, u64, u64, u128, i64, bool); 15] = [
            (0, 6, 5, 0, -1, true),
            (0, 1, 4, 1000, -1, false),
            (0, 1, 3, 2000, -1, false),
            (0, 1, 2, 3000, -1, false),
            (0, 1, 1, 4000, -1, false),
            (0, 1, 0, 5000, -1, false),
            (0, 1, 0, 5000, 1000, true),
            (3000, 1, 2, 3000, -1, false),
            (3100, 1, 1, 3900, -1, false),
            (4000, 1, 1, 4000, -1, false),
            (8000, 1, 4, 1000, -1, false),
            (9500, 1, 4, 1000, -1, false),
            (9500, 0, 4, 1000, -1, false),
            (9500, 2, 2, 3000, -1, false),
            (9500, 5, 2, 3000, 3000, true),
        ];
        let mut state = None;
        for (i, &(at, quantity, remaining, reset_ms, retry_ms, limited)) in cases.iter().enumerate()
        {
            let (v, next) = decide(state.as_ref(), p, Millis(start + at), quantity);
            assert_eq!(!v.conforms, limited, "case {i}");
            assert_eq!(v.ahead, Nanos(reset_ms * NANOS_PER_MILLI), "case {i}");
            let retry = v.wait.map_or(-1, |w| (w.0 / NANOS_PER_MILLI) as i64);
            assert_eq!(retry, retry_ms, "case {i}");
            let reply = v.redis_cell_reply();
            assert_eq!(reply[2], remaining as i64, "case {i}");
            assert_eq!(reply[1], 5);
            if next.is_some() {
                state = next;
            }
        }
    }

    #[test]
    fn redis_cell_readme_example() {
        // CL.THROTTLE user123 15 30 60 on a fresh key.
        let (v, _) = decide(None, cell(15, 30, 60), Millis(1_000), 1);
        assert_eq!(v.redis_cell_reply(), [0, 16, 15, -1, 2]);
    }

    #[test]
    fn cell_rounding_drops_sub_millisecond_remainders() {
        assert_eq!(cell_seconds(Nanos(0)), 0);
        assert_eq!(cell_seconds(Nanos(999_999)), 0);
        assert_eq!(cell_seconds(Nanos(1_000_000)), 1);
        assert_eq!(cell_seconds(Nanos(1_000_000_000)), 1);
        assert_eq!(cell_seconds(Nanos(1_000_999_999)), 1);
        assert_eq!(cell_seconds(Nanos(1_001_000_000)), 2);
    }

    #[test]
    fn burst_then_the_rate() {
        // 3 at once, then one per 100 ms.
        let p = params(3, 10, 1000);
        let mut state = None;
        for remaining in [2, 1, 0] {
            let (v, next) = decide(state.as_ref(), p, Millis(5_000), 1);
            let out = v.outcome();
            assert!(out.allowed);
            assert_eq!(out.remaining, remaining);
            state = next;
        }
        let (v, next) = decide(state.as_ref(), p, Millis(5_000), 1);
        let out = v.outcome();
        assert!(!out.allowed && next.is_none());
        assert_eq!(out.retry_after, RetryAfter::After(Millis(100)));
        assert_eq!(out.reset_after, Millis(300));
        assert!(!decide(state.as_ref(), p, Millis(5_099), 1).0.conforms);
        assert!(decide(state.as_ref(), p, Millis(5_100), 1).0.conforms);
    }

    #[test]
    fn a_billion_per_second_and_one_per_ten_years_are_exact() {
        let fast = params(1_000_000_000, 1_000_000_000, 1000);
        let (v, s) = decide(None, fast, Millis(0), 1_000_000_000);
        assert!(v.conforms);
        assert_eq!(v.ahead, Nanos(1_000_000_000));
        let (v, _) = decide(s.as_ref(), fast, Millis(1), 0);
        assert_eq!(v.outcome().remaining, 1_000_000);

        let slow = params(1, 1, super::super::MAX_PERIOD.0);
        let (v, s) = decide(None, slow, Millis(0), 1);
        assert!(v.conforms);
        assert_eq!(s.unwrap().full_at(), super::super::MAX_PERIOD);
        let (v, _) = decide(s.as_ref(), slow, Millis(1), 1);
        assert_eq!(
            v.outcome().retry_after,
            RetryAfter::After(Millis(super::super::MAX_PERIOD.0 - 1))
        );
    }

    #[test]
    fn odd_rates_round_the_interval_up() {
        // 3 per second: T = 333,333,333.3 ns, rounded up to 333,333,334.
        let p = params(3, 3, 1000);
        let mut state = None;
        for remaining in [2, 1, 0] {
            let (v, next) = decide(state.as_ref(), p, Millis(0), 1);
            assert!(v.conforms, "the whole burst of 3 passes");
            assert_eq!(v.outcome().remaining, remaining);
            state = next;
        }
        assert_eq!(state.unwrap().tat(), Nanos(1_000_000_002));
        assert!(!decide(state.as_ref(), p, Millis(0), 1).0.conforms);
        assert!(decide(None, p, Millis(0), 3).0.conforms);
    }

    #[test]
    fn peeks_write_nothing_and_report_allowed() {
        let p = params(2, 1, 1000);
        let (_, s) = decide(None, p, Millis(0), 2);
        let (v, next) = decide(s.as_ref(), p, Millis(0), 0);
        assert!(next.is_none());
        let out = v.outcome();
        assert!(out.allowed);
        assert_eq!((out.remaining, out.reset_after), (0, Millis(2000)));
        // Over a lowered limit: still allowed as a peek; redis-cell says limited.
        let lower = params(1, 1, 1000);
        let (v, next) = decide(s.as_ref(), lower, Millis(0), 0);
        assert!(next.is_none() && v.outcome().allowed && !v.conforms);
    }

    #[test]
    fn never_when_the_cost_exceeds_the_burst() {
        let (v, next) = decide(None, params(5, 1, 1000), Millis(0), 6);
        assert_eq!(v.outcome().retry_after, RetryAfter::Never);
        assert!(next.is_none());
        assert_eq!(v.outcome().remaining, 5);
    }

    #[test]
    fn clock_going_back_creates_no_room() {
        let p = params(1, 1, 1000);
        let (_, s) = decide(None, p, Millis(50_000), 1);
        let (v, _) = decide(s.as_ref(), p, Millis(10_000), 1);
        assert!(!v.conforms);
        assert_eq!(v.outcome().retry_after, RetryAfter::After(Millis(41_000)));
    }

    #[test]
    fn parameter_bounds() {
        assert_eq!(
            params(1, 1_000_000_001, 1000).check(),
            Err(ParamError::RateTooHigh)
        );
        assert!(params(1, 1_000_000_000, 1000).check().is_ok());
        let huge = params(1_000_000_000_000_000, 1, super::super::MAX_PERIOD.0);
        assert_eq!(huge.check(), Err(ParamError::ToleranceTooLong));
    }

    #[test]
    fn struct_stays_small() {
        assert!(std::mem::size_of::<Gcra>() <= 48);
    }
}
