//! The bounds of every stored value, in one place. The argument parser
//! refuses parameters outside them; the loader (RDB, RESTORE, MIGRATE,
//! RL.APPLY) refuses states outside them; and every command, applied to any
//! state inside them at any time, writes a state inside them. That last
//! property is what keeps a dataset loadable: a value the module accepts
//! and then changes must still be one it accepts (see the closure property
//! tests in `model_tests/closure.rs`).
//!
//! Times come in two kinds. An *anchor* is a moment the module has seen
//! (a last update, a window start, a log entry, the clock itself): at most
//! [`MAX_TIME`]. A *deadline* is an anchor plus a duration of at most
//! [`MAX_PERIOD`] (a lease's end, a lock's end): at most [`MAX_DEADLINE`],
//! and no further past its own anchor where the state keeps one.

// From time.rs, not through mod.rs: mod.rs re-exports these bounds.
use super::time::Millis;

/// The largest `capacity`, `limit`, `refill_amount` and `COST` accepted: 10^15.
/// With periods up to 3650 days every product the algorithms form
/// (count x period in milliseconds) stays far below u128::MAX, and the numbers
/// stay exact in clients that hold integers in IEEE doubles (< 2^53).
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;

/// Shortest and longest period, TTL and lockout: 1 ms and 3650 days.
pub const MIN_PERIOD: Millis = Millis(1);
pub const MAX_PERIOD: Millis = Millis(3650 * 24 * 60 * 60 * 1000);

/// The latest anchor a stored state may carry, and the latest the module's
/// clock reads: 2^53 ms, some 285,000 years. It keeps every time sum and a
/// sliding log's `gap << 1` encoding far from overflow.
pub const MAX_TIME: Millis = Millis(1 << 53);

/// The latest deadline: an anchor plus the longest duration.
pub const MAX_DEADLINE: Millis = Millis(MAX_TIME.0 + MAX_PERIOD.0);

/// The clock as the algorithms use it: the server's, but never later than
/// [`MAX_TIME`]. No real clock gets there; a state restored with anchors at
/// [`MAX_TIME`] then sees a clock that stands still, which the algorithms
/// already handle (a clock that went back), and every deadline they set
/// stays within [`MAX_DEADLINE`].
pub fn clock(now: Millis) -> Millis {
    now.min(MAX_TIME)
}

/// A duration as the algorithms use it: within [`MIN_PERIOD`, `MAX_PERIOD`]
/// (the parser refuses others), so no deadline runs past [`MAX_DEADLINE`].
pub fn duration(d: Millis) -> Millis {
    d.clamp(MIN_PERIOD, MAX_PERIOD)
}

pub fn is_count(n: u64) -> bool {
    (1..=MAX_COUNT).contains(&n)
}

pub fn is_period(p: Millis) -> bool {
    (MIN_PERIOD..=MAX_PERIOD).contains(&p)
}

pub fn is_anchor(t: Millis) -> bool {
    t <= MAX_TIME
}

pub fn is_deadline(t: Millis) -> bool {
    t <= MAX_DEADLINE
}

/// A deadline set at `anchor` (or later, up to `anchor`): still ahead of it,
/// and at most the longest duration beyond it.
pub fn is_deadline_after(anchor: Millis, deadline: Millis) -> bool {
    deadline > anchor && deadline.0 - anchor.0 <= MAX_PERIOD.0
}

/// The earliest moment a deadline set for at most [`MAX_PERIOD`] can have
/// been set at: a clock reading earlier than that has gone back.
pub fn set_no_earlier_than(deadline: Millis) -> Millis {
    deadline.saturating_sub(MAX_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_deadline_from_a_clock_reading_is_a_deadline() {
        for now in [0, 1, MAX_TIME.0 - 1, MAX_TIME.0, MAX_TIME.0 + 1, u64::MAX] {
            let anchor = clock(Millis(now));
            assert!(is_anchor(anchor));
            let deadline = anchor.saturating_add(MAX_PERIOD);
            assert!(is_deadline(deadline));
            assert!(is_deadline_after(anchor, deadline));
            assert!(!is_deadline_after(
                anchor,
                deadline.saturating_add(Millis(1))
            ));
            assert!(!is_deadline_after(anchor, anchor));
        }
    }
}
