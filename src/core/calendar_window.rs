//! Calendar window: a fixed window whose periods are calendar periods (a
//! local day, week, month or year, see `calendar.rs`) instead of equal
//! lengths aligned to the epoch: "1,000 a month, resetting on the 1st in the
//! customer's time zone". A request is allowed while this period's count +
//! cost <= limit.
//!
//! The state stores the period's two instants with its count, so deciding
//! inside a period, a replica, an AOF replay and a load all work without
//! zone data; only opening a new period computes one.
//!
//! Changing parameters mid-period: a new limit applies at once to the count
//! so far (as RL.WINDOW does). A new calendar (unit, anchor or zone) opens
//! the new calendar's period that holds `now`, and the count so far carries
//! into it (erring on the side of fewer requests); the new calendar is
//! stored at its first request, allowed or not, and its periods follow.

use super::bounds::clock;
use super::calendar::{Calendar, MAX_CALENDAR_PERIOD};
use super::{until, Millis, Outcome, RetryAfter, MAX_COUNT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CalendarParams {
    pub limit: u64,
    pub calendar: Calendar,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CalendarWindow {
    pub params: CalendarParams,
    /// The current period, [start, end).
    pub start: Millis,
    pub end: Millis,
    pub count: u64,
}

impl CalendarWindow {
    /// A period as `Calendar::period_at` makes them and a count a request
    /// could leave (a lowered limit leaves a count above it).
    pub fn is_valid(&self) -> bool {
        self.params.calendar.is_valid()
            && self.start < self.end
            && self.end.0 - self.start.0 <= MAX_CALENDAR_PERIOD.0
            && self.count <= MAX_COUNT
    }

    /// When the count is gone: the key expires then.
    pub fn empty_at(&self) -> Millis {
        if self.count > 0 {
            self.end
        } else {
            self.start
        }
    }

    /// The state at `now` under `params`. A clock that went back stays in
    /// the stored period.
    fn advanced(&self, params: CalendarParams, now: Millis) -> CalendarWindow {
        if params.calendar != self.params.calendar {
            let (start, end) = params.calendar.period_at(now);
            let count = if now < self.end { self.count } else { 0 };
            return CalendarWindow {
                params,
                start,
                end,
                count,
            };
        }
        if now < self.end {
            return CalendarWindow { params, ..*self };
        }
        opened(params, now)
    }
}

fn opened(params: CalendarParams, now: Millis) -> CalendarWindow {
    let (start, end) = params.calendar.period_at(now);
    CalendarWindow {
        params,
        start,
        end,
        count: 0,
    }
}

/// Gives back up to `amount` of this period's count at `now`, never below
/// zero; a period that has ended gives nothing back.
pub fn refund(window: &CalendarWindow, now: Millis, amount: u64) -> (CalendarWindow, u64) {
    let now = clock(now);
    if now >= window.end {
        return (*window, 0);
    }
    let given = amount.min(window.count);
    let after = CalendarWindow {
        count: window.count - given,
        ..*window
    };
    (after, given)
}

/// Decides a request of `cost` at `now`.
pub fn decide(
    state: Option<&CalendarWindow>,
    params: CalendarParams,
    now: Millis,
    cost: u64,
) -> (Outcome, Option<CalendarWindow>) {
    let now = clock(now);
    let mut window = match state {
        Some(window) => window.advanced(params, now),
        None => opened(params, now),
    };
    let limit = params.limit;
    // A peek (cost 0) asks for nothing, so it is always granted.
    let allowed = cost == 0 || (cost <= limit && window.count.saturating_add(cost) <= limit);
    if allowed {
        window.count += cost;
    }
    let retry_after = if allowed {
        RetryAfter::After(Millis::ZERO)
    } else if cost > limit {
        RetryAfter::Never
    } else {
        RetryAfter::After(until(window.end, now))
    };
    let outcome = Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(window.count),
        retry_after,
        reset_after: if window.count > 0 {
            until(window.end, now)
        } else {
            Millis::ZERO
        },
    };
    // A new calendar is stored even by a denied request (as a token
    // bucket's new parameters are), so the switch happens once: the count
    // carried into the new calendar's period stays there until it ends.
    let recalendared = state.is_some_and(|s| s.params.calendar != params.calendar);
    let changed = cost > 0 && (allowed || recalendared);
    (outcome, changed.then_some(window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::calendar::{Unit, ZoneName};

    fn ms(text: &str) -> Millis {
        let ts: jiff::Timestamp = text.parse().unwrap();
        Millis(ts.as_millisecond() as u64)
    }

    fn monthly(limit: u64, anchor: u8, zone: &str) -> CalendarParams {
        CalendarParams {
            limit,
            calendar: Calendar {
                unit: Unit::Month,
                anchor,
                zone: ZoneName::known(zone.as_bytes()).unwrap(),
            },
        }
    }

    fn run(state: &mut Option<CalendarWindow>, p: CalendarParams, at: &str, cost: u64) -> Outcome {
        let (out, next) = decide(state.as_ref(), p, ms(at), cost);
        if next.is_some() {
            *state = next;
        }
        out
    }

    #[test]
    fn a_monthly_quota_resets_at_the_local_first() {
        let p = monthly(3, 1, "Europe/Berlin");
        let mut state = None;
        for _ in 0..3 {
            assert!(run(&mut state, p, "2026-11-30T12:00:00Z", 1).allowed);
        }
        let denied = run(&mut state, p, "2026-11-30T22:59:59.999Z", 1);
        assert!(!denied.allowed);
        // Berlin's December starts at 23:00 UTC on November 30th.
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(1)));
        assert!(run(&mut state, p, "2026-11-30T23:00:00Z", 1).allowed);
        let s = state.unwrap();
        assert_eq!(
            (s.start, s.end),
            (ms("2026-11-30T23:00:00Z"), ms("2026-12-31T23:00:00Z"))
        );
        assert_eq!(s.empty_at(), s.end);
    }

    #[test]
    fn a_lowered_limit_applies_to_the_count_so_far() {
        let mut state = None;
        for _ in 0..5 {
            run(&mut state, monthly(10, 1, "UTC"), "2026-12-04T00:00:00Z", 1);
        }
        let lowered = monthly(4, 1, "UTC");
        let out = run(&mut state, lowered, "2026-12-05T00:00:00Z", 1);
        assert!(!out.allowed);
        assert_eq!(out.remaining, 0);
        assert_eq!(
            out.retry_after,
            RetryAfter::After(Millis(
                ms("2027-01-01T00:00:00Z").0 - ms("2026-12-05T00:00:00Z").0
            ))
        );
        assert!(run(&mut state, monthly(6, 1, "UTC"), "2026-12-05T00:00:00Z", 1).allowed);
    }

    #[test]
    fn a_new_calendar_carries_the_count_into_its_own_period() {
        let mut state = None;
        for _ in 0..3 {
            run(&mut state, monthly(3, 1, "UTC"), "2026-12-04T00:00:00Z", 1);
        }
        // Moved to an anchor on the 15th: the period from Nov 15th to Dec
        // 15th holds now, and the 3 requests count in it.
        let moved = monthly(3, 15, "UTC");
        let out = run(&mut state, moved, "2026-12-04T00:00:00Z", 1);
        assert!(!out.allowed);
        assert_eq!(out.retry_after, RetryAfter::After(Millis(11 * 86_400_000)));
        assert!(run(&mut state, moved, "2026-12-15T00:00:00Z", 1).allowed);
    }

    #[test]
    fn a_clock_that_goes_back_stays_in_the_period() {
        let p = monthly(1, 1, "UTC");
        let mut state = None;
        assert!(run(&mut state, p, "2026-12-01T00:00:00Z", 1).allowed);
        assert!(!run(&mut state, p, "2026-11-30T00:00:00Z", 1).allowed);
    }

    #[test]
    fn refunds_give_back_this_period_only() {
        let p = monthly(2, 1, "UTC");
        let mut state = None;
        run(&mut state, p, "2026-12-04T00:00:00Z", 2);
        let s = state.unwrap();
        assert_eq!(refund(&s, ms("2026-12-10T00:00:00Z"), 5).1, 2);
        assert_eq!(refund(&s, ms("2027-01-01T00:00:00Z"), 5).1, 0);
    }
}
