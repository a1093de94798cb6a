//! RL.INSPECT: a limiter's raw state at a time, as named fields, for
//! operators and for clients that need more than the five-field reply (the
//! `limits` storage's `get_sliding_window` wants the previous and current
//! counts and how long each still weighs). Read-only: nothing is advanced in
//! storage, the state is only computed as of `now`.

use std::ffi::CStr;

use super::limiter::Limiter;
use super::window::Window;
use super::{until, Millis};

/// One field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Int(i64),
    Text(&'static str),
    /// A calendar window's time zone name.
    Zone(crate::core::calendar::ZoneName),
    Null,
}

/// Named fields in reply order.
pub type Inspection = Vec<(&'static CStr, Field)>;

fn int(ms: Millis) -> Field {
    Field::Int(ms.to_i64_saturating())
}

fn count(n: u64) -> Field {
    Field::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The fields of `limiter` at `now`: first `algorithm`, then its parameters,
/// then its state, then `locked_until_ms` (nil when no lock is in force).
pub fn inspect(limiter: &Limiter, now: Millis) -> Inspection {
    let (inner, locked_until) = match limiter {
        Limiter::Locked(locked) if locked.until > now => (&locked.inner, Some(locked.until)),
        Limiter::Locked(locked) => (&locked.inner, None),
        other => (other, None),
    };
    let mut fields = state(inner, now);
    fields.push((c"locked_until_ms", locked_until.map_or(Field::Null, int)));
    fields
}

fn state(limiter: &Limiter, now: Millis) -> Inspection {
    match limiter {
        Limiter::TokenBucket(bucket) => vec![
            (c"algorithm", Field::Text("tokenbucket")),
            (c"capacity", count(bucket.params.capacity)),
            (c"refill_amount", count(bucket.params.refill_amount)),
            (c"refill_period_ms", int(bucket.params.refill_period)),
            (c"tokens", count(limiter.peek(now).remaining)),
            // What is stored, exactly: the level is kept in 1/refill_period_ms
            // of a token, so that refilling never rounds.
            (c"last_update_ms", int(bucket.last)),
            (
                c"stored_level",
                Field::Int(i64::try_from(bucket.level()).unwrap_or(i64::MAX)),
            ),
        ],
        Limiter::FixedWindow(w) => window(w.at(now), false, now),
        Limiter::SlidingWindow(w) => window(w.at(now), true, now),
        Limiter::SlidingLog(log) => {
            let period = log.params.period;
            let at = now.max(log.last_update());
            let live: Vec<(Millis, u64)> = log
                .entries()
                .filter(|(time, _)| time.saturating_add(period) > at)
                .collect();
            vec![
                (c"algorithm", Field::Text("slidinglog")),
                (c"limit", count(log.params.limit)),
                (c"period_ms", int(period)),
                (c"count", count(live.iter().map(|(_, n)| n).sum())),
                (c"entries", count(live.len() as u64)),
                (c"oldest_ms", live.first().map_or(Field::Null, |e| int(e.0))),
                (c"newest_ms", live.last().map_or(Field::Null, |e| int(e.0))),
            ]
        }
        Limiter::Gcra(g) => {
            let params = g.params();
            vec![
                (c"algorithm", Field::Text("gcra")),
                (c"burst", count(params.limit)),
                (c"rate", count(params.rate)),
                (c"period_ms", int(params.period)),
                (c"tat_ms", int(g.tat().ceil_millis())),
            ]
        }
        Limiter::Lease(leases) => vec![
            (c"algorithm", Field::Text("lease")),
            (c"limit", count(leases.limit)),
            (c"in_use", count(leases.in_use(now))),
            (
                c"leases",
                count(leases.held().iter().filter(|l| l.expires_at > now).count() as u64),
            ),
        ],
        Limiter::CalendarWindow(w) => {
            let calendar = w.params.calendar;
            let current = if now < w.end { w.count } else { 0 };
            vec![
                (c"algorithm", Field::Text("calendar-window")),
                (c"limit", count(w.params.limit)),
                (c"unit", Field::Text(calendar.unit.name())),
                (c"anchor", count(u64::from(calendar.anchor))),
                (c"zone", Field::Zone(calendar.zone)),
                (c"period_start_ms", int(w.start)),
                (c"period_ends_in_ms", int(until(w.end, now))),
                (c"current", count(current)),
            ]
        }
        // `inspect` unwraps the lock; a lock never holds a lock.
        Limiter::Locked(locked) => state(&locked.inner, now),
    }
}

/// A window's counts, and how long each still counts: the previous window's
/// count weighs on a sliding estimate until the current window ends, the
/// current count until the window after it ends.
fn window(w: Window, sliding: bool, now: Millis) -> Inspection {
    let period = w.params.period;
    let ends = w.start.saturating_add(period);
    let mut fields = vec![
        (
            c"algorithm",
            Field::Text(if sliding { "window-sliding" } else { "window" }),
        ),
        (c"limit", count(w.params.limit)),
        (c"period_ms", int(period)),
        (c"window_start_ms", int(w.start)),
        (c"window_ends_in_ms", int(until(ends, now))),
        (c"current", count(w.current)),
    ];
    if sliding {
        fields.push((c"previous", count(w.previous)));
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::window::{self, WindowParams};

    fn value(fields: &Inspection, name: &CStr) -> Field {
        fields
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no field {name:?}"))
    }

    #[test]
    fn sliding_window_reports_both_counts_and_their_weight_time() {
        let params = WindowParams {
            limit: 10,
            period: Millis(1000),
        };
        let (_, state) = window::decide(None, params, true, Millis(5_200), 3);
        let limiter = Limiter::SlidingWindow(state.expect("allowed"));
        // Next window: the 3 became the previous count.
        let fields = inspect(&limiter, Millis(6_250));
        assert_eq!(value(&fields, c"algorithm"), Field::Text("window-sliding"));
        assert_eq!(value(&fields, c"previous"), Field::Int(3));
        assert_eq!(value(&fields, c"current"), Field::Int(0));
        assert_eq!(value(&fields, c"window_start_ms"), Field::Int(6_000));
        assert_eq!(value(&fields, c"window_ends_in_ms"), Field::Int(750));
        assert_eq!(value(&fields, c"locked_until_ms"), Field::Null);
        // Two windows later nothing is left.
        let fields = inspect(&limiter, Millis(7_000));
        assert_eq!(value(&fields, c"previous"), Field::Int(0));
    }

    #[test]
    fn token_bucket_reports_its_exact_stored_level() {
        use crate::core::token_bucket::{TokenBucket, TokenBucketParams};
        let params = TokenBucketParams {
            capacity: 10,
            refill_amount: 3,
            refill_period: Millis(1000),
        };
        // 2.5 tokens stored at t=4000: 2,500 thousandths.
        let limiter = Limiter::TokenBucket(TokenBucket::new(params, Millis(4_000), 2_500));
        let fields = inspect(&limiter, Millis(4_100));
        assert_eq!(value(&fields, c"last_update_ms"), Field::Int(4_000));
        assert_eq!(value(&fields, c"stored_level"), Field::Int(2_500));
        // 100 ms later 300 thousandths more: 2.8, two whole tokens.
        assert_eq!(value(&fields, c"tokens"), Field::Int(2));
        let fields = inspect(&limiter, Millis(4_167));
        assert_eq!(value(&fields, c"tokens"), Field::Int(3));
    }
}
