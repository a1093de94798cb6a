//! Windows of `period` aligned to the Unix epoch (a 1-minute window is a clock
//! minute), in two flavours sharing one state:
//!
//! - fixed window: allowed while this window's count + cost <= limit. Cheap,
//!   but a client can spend the limit at the end of one window and again at
//!   the start of the next.
//! - sliding window counter: the previous window's count is weighted by how
//!   much of it still overlaps the last `period`:
//!   estimate = current + previous * (period - elapsed) / period. The
//!   comparison is cross-multiplied by `period`, so it is exact in integers.

use super::bounds::clock;
use super::{until, Millis, Outcome, RetryAfter, MAX_COUNT};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    pub limit: u64,
    pub period: Millis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub params: WindowParams,
    /// Start of the current window. A changed period applies from this start
    /// (the current window becomes [start, start + new period)).
    pub start: Millis,
    /// Count of the window before `start` (sliding mode only).
    pub previous: u64,
    pub current: u64,
}

impl Window {
    fn empty(params: WindowParams, now: Millis) -> Window {
        Window {
            params,
            start: now.align_down(params.period),
            previous: 0,
            current: 0,
        }
    }

    /// Counts never exceed the largest limit (a request is only counted when
    /// it fits), and a fixed window has no previous count.
    pub fn is_valid(&self, sliding: bool) -> bool {
        self.current <= MAX_COUNT && self.previous <= MAX_COUNT && (sliding || self.previous == 0)
    }

    /// When nothing counted is left: the key expires then. A sliding window
    /// still weighs the current count during the whole next window.
    pub fn empty_at(&self, sliding: bool) -> Millis {
        let period = self.params.period;
        if self.current > 0 && sliding {
            self.start
                .saturating_add(Millis(period.0.saturating_mul(2)))
        } else if self.current > 0 || self.previous > 0 {
            self.start.saturating_add(period)
        } else {
            self.start
        }
    }

    /// The state at `now` under its own parameters (read-only: RL.INSPECT).
    pub fn at(&self, now: Millis) -> Window {
        self.advanced(self.params, now)
    }

    /// The state at `now`, with `params` applied. A clock that went back stays
    /// in the stored window, so it never frees room.
    fn advanced(&self, params: WindowParams, now: Millis) -> Window {
        let period = params.period;
        let now = now.max(self.start);
        let end = self.start.saturating_add(period);
        if now < end {
            return Window { params, ..*self };
        }
        let start = now.align_down(period);
        // After a period change the stored window may not end where the new
        // alignment starts. Err on the side of fewer requests: a count whose
        // window still overlaps the new current window stays current, and it
        // stays the previous window's as long as it could overlap that.
        let stored_end = self.start.saturating_add(self.params.period);
        if stored_end > start {
            return Window {
                params,
                start,
                previous: self.previous,
                current: self.current,
            };
        }
        let previous = if start < stored_end.max(end).saturating_add(period) {
            self.current
        } else {
            0
        };
        Window {
            params,
            start,
            previous,
            current: 0,
        }
    }
}

/// Gives back up to `amount` of the current window's count at `now`, never
/// below zero. A window that has ended gives nothing back: its count (the
/// sliding counter's previous window) stays as it was. Returns the new state
/// and how much was given back.
pub fn refund(window: &Window, sliding: bool, now: Millis, amount: u64) -> (Window, u64) {
    let now = clock(now);
    let mut current = window.advanced(window.params, now);
    if !sliding {
        current.previous = 0;
    }
    let given = amount.min(current.current);
    current.current -= given;
    (current, given)
}

/// Decides a request of `cost` at `now`; `sliding` picks the algorithm.
pub fn decide(
    state: Option<&Window>,
    params: WindowParams,
    sliding: bool,
    now: Millis,
    cost: u64,
) -> (Outcome, Option<Window>) {
    let now = clock(now);
    let mut window = match state {
        Some(window) => window.advanced(params, now),
        None => Window::empty(params, now),
    };
    if !sliding {
        window.previous = 0;
    }
    let elapsed = now.max(window.start).saturating_sub(window.start).0;
    let period = u128::from(params.period.0);
    let limit = u128::from(params.limit);
    // previous * (period - elapsed): the previous window's weight, times period.
    let carried = u128::from(window.previous) * (period - u128::from(elapsed).min(period));
    let used = carried + u128::from(window.current) * period;
    // A peek (cost 0) asks for nothing, so it is always granted, even over a
    // lowered limit: it reports remaining = 0 there, never a wait.
    let allowed =
        cost == 0 || (cost <= params.limit && used + u128::from(cost) * period <= limit * period);
    if allowed {
        window.current += cost;
    }
    let used_after = carried + u128::from(window.current) * period;
    let remaining = (limit * period).saturating_sub(used_after) / period;

    let retry_after = if allowed {
        RetryAfter::After(Millis::ZERO)
    } else if cost > params.limit {
        RetryAfter::Never
    } else {
        RetryAfter::After(until(ready_at(&window, sliding, cost), now))
    };
    let outcome = Outcome {
        allowed,
        limit: params.limit,
        remaining: u64::try_from(remaining).unwrap_or(u64::MAX),
        retry_after,
        reset_after: if used_after == 0 {
            Millis::ZERO
        } else {
            until(window.empty_at(sliding), now)
        },
    };
    let changed = allowed && cost > 0;
    (outcome, changed.then_some(window))
}

/// The first moment a request of `cost` (<= limit) fits, with no other traffic.
fn ready_at(window: &Window, sliding: bool, cost: u64) -> Millis {
    let period = window.params.period;
    let next_start = window.start.saturating_add(period);
    if !sliding {
        return next_start;
    }
    let limit = window.params.limit;
    // Within a window that starts at `start` and carries `previous`, the
    // request fits from elapsed time e where previous * (period - e) <= room *
    // period, that is e >= period - floor(room * period / previous).
    let fits_from = |start: Millis, previous: u64, room: u64| -> Millis {
        if previous == 0 {
            return start;
        }
        let p = u128::from(period.0);
        let slack = (u128::from(room) * p / u128::from(previous)).min(p);
        start.saturating_add(Millis((p - slack) as u64))
    };
    if window.current.saturating_add(cost) <= limit {
        fits_from(window.start, window.previous, limit - window.current - cost)
    } else {
        // Only once this window has become the previous one.
        fits_from(next_start, window.current, limit - cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    fn params(limit: u64, period: u64) -> WindowParams {
        WindowParams {
            limit,
            period: Millis(period),
        }
    }

    fn run(
        state: &mut Option<Window>,
        p: WindowParams,
        sliding: bool,
        now: u64,
        cost: u64,
    ) -> Outcome {
        let (out, next) = decide(state.as_ref(), p, sliding, Millis(now), cost);
        if let Some(next) = next {
            *state = Some(next);
        }
        out
    }

    #[test]
    fn fixed_window_allows_a_burst_on_each_side_of_the_boundary() {
        let p = params(10, MINUTE);
        let mut state = None;
        assert!(run(&mut state, p, false, MINUTE - 1, 10).allowed);
        let denied = run(&mut state, p, false, MINUTE - 1, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(1)));
        assert!(run(&mut state, p, false, MINUTE, 10).allowed);
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let p = params(10, MINUTE);
        let mut state = None;
        assert!(run(&mut state, p, true, MINUTE - 1, 10).allowed);
        // Just after the boundary the previous window still weighs ~10.
        let out = run(&mut state, p, true, MINUTE, 1);
        assert!(!out.allowed);
        // Half-way through, the estimate is 5: five more fit, not six.
        let half = MINUTE + MINUTE / 2;
        assert_eq!(run(&mut state, p, true, half, 0).remaining, 5);
        assert!(!run(&mut state, p, true, half, 6).allowed);
        assert!(run(&mut state, p, true, half, 5).allowed);
    }

    #[test]
    fn sliding_retry_after_is_exact() {
        let p = params(10, 1000);
        let mut state = None;
        run(&mut state, p, true, 0, 10);
        let out = run(&mut state, p, true, 1000, 1);
        // previous 10 * (1000 - e) <= 9 * 1000 from e = 100.
        assert_eq!(out.retry_after, RetryAfter::After(Millis(100)));
        assert!(!run(&mut state, p, true, 1099, 1).allowed);
        assert!(run(&mut state, p, true, 1100, 1).allowed);
    }

    #[test]
    fn reset_after_counts_the_overlap_of_the_sliding_window() {
        let p = params(10, 1000);
        let (out, _) = decide(None, p, true, Millis(250), 1);
        assert_eq!(out.reset_after, Millis(1750));
        let (out, _) = decide(None, p, false, Millis(250), 1);
        assert_eq!(out.reset_after, Millis(750));
    }

    #[test]
    fn a_shorter_period_keeps_the_current_count() {
        let mut state = None;
        assert!(run(&mut state, params(10, 1000), false, 999, 10).allowed);
        // [0, 1000) still holds 10: a 300 ms window starting at 900 must too.
        assert!(!run(&mut state, params(10, 300), false, 999, 10).allowed);
        assert!(!run(&mut state, params(10, 300), true, 999, 10).allowed);
    }

    #[test]
    fn clock_going_back_frees_no_room() {
        let p = params(1, 1000);
        let mut state = None;
        run(&mut state, p, false, 5_500, 1);
        let out = run(&mut state, p, false, 1_200, 1);
        assert!(!out.allowed);
        assert_eq!(out.retry_after, RetryAfter::After(Millis(4_800)));
    }
}
