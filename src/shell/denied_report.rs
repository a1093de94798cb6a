//! Who is being limited: the keys denied most often on this node, per
//! interval of `ratelimit.denied-report-interval` seconds (aligned to the
//! epoch, so every node's intervals coincide), in a Space-Saving sketch of
//! `ratelimit.denied-report-size` keys (core/heavy_hitters.rs): bounded
//! memory, and a count off by at most N / size for N denials. Only denials
//! touch it; an allowed request costs nothing here. `RL.TOPDENIED [count]`
//! reads the current interval and the one before.
//!
//! Kept in memory on the node that decides (a primary): a restart, a
//! failover or a change of size starts it anew.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI64, Ordering};

use super::ffi::{self, Ctx, Str};
use crate::args;
use crate::core::heavy_hitters::SpaceSaving;
use crate::core::Millis;

/// `ratelimit.denied-report-size`: keys tracked per interval (0: off).
pub static SIZE: AtomicI64 = AtomicI64::new(DEFAULT_SIZE);
pub const DEFAULT_SIZE: i64 = 100;
pub const MAX_SIZE: i64 = 10_000;
/// `ratelimit.denied-report-interval`: the interval, in seconds.
pub static INTERVAL: AtomicI64 = AtomicI64::new(DEFAULT_INTERVAL);
pub const DEFAULT_INTERVAL: i64 = 60;
pub const MAX_INTERVAL: i64 = 86_400;

/// The most keys one call lists.
const MAX_LISTED: u64 = 10_000;

struct Interval {
    start: Millis,
    sketch: SpaceSaving,
}

#[derive(Default)]
struct Report {
    current: Option<Interval>,
    previous: Option<Interval>,
}

thread_local! {
    static REPORT: RefCell<Report> = RefCell::new(Report::default());
}

fn settings() -> (usize, Millis) {
    let size = SIZE.load(Ordering::Relaxed).clamp(0, MAX_SIZE) as usize;
    let seconds = INTERVAL.load(Ordering::Relaxed).clamp(1, MAX_INTERVAL) as u64;
    (size, Millis(seconds * 1000))
}

impl Report {
    /// Moves to the interval holding `now`: the current one becomes the
    /// previous one when it is the interval just before, else an empty one
    /// stands for the quiet interval between.
    fn roll(&mut self, now: Millis, size: usize, length: Millis) {
        let start = now.align_down(length);
        let fresh = |start| Interval {
            start,
            sketch: SpaceSaving::new(size),
        };
        let stale = self
            .current
            .as_ref()
            .is_none_or(|c| c.sketch.capacity() != size || c.start.0 % length.0 != 0);
        if stale {
            *self = Report {
                current: Some(fresh(start)),
                previous: None,
            };
            return;
        }
        let Some(current) = self.current.take() else {
            return;
        };
        if current.start >= start {
            self.current = Some(current);
            return;
        }
        let previous_start = Millis(start.0 - length.0);
        self.previous = Some(if current.start == previous_start {
            current
        } else {
            fresh(previous_start)
        });
        self.current = Some(fresh(start));
    }
}

/// A denial of `key` (from `controls::on_denied`).
pub fn record(key: Str) {
    let (size, length) = settings();
    if size == 0 {
        return;
    }
    let now = ffi::now();
    REPORT.with_borrow_mut(|report| {
        report.roll(now, size, length);
        if let Some(current) = &mut report.current {
            current.sketch.offer(ffi::bytes(key));
        }
    });
}

/// `RL.TOPDENIED [count]`: the interval's length, then the current and the
/// previous interval (nil until there is one), each as its start, its
/// denials and its `count` (default 10) most denied keys with their counts
/// and error bounds.
pub fn top_denied(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() > 2 {
        return ffi::reply_error(ctx, "ERR wrong number of arguments: RL.TOPDENIED [count]");
    }
    let count = match argv.get(1) {
        None => 10,
        Some(text) => match args::parse_u64(ffi::bytes(*text))
            .filter(|n| (1..=MAX_LISTED).contains(n))
        {
            Some(n) => n,
            None => return ffi::reply_error(ctx, "ERR count must be an integer from 1 to 10000"),
        },
    } as usize;
    let (size, length) = settings();
    REPORT.with_borrow_mut(|report| {
        if size > 0 {
            report.roll(ffi::now(), size, length);
        } else {
            // Off: nothing is kept, and nothing old is shown.
            *report = Report::default();
        }
        let mut out = ffi::Nested::new(ctx);
        out.map(3);
        out.name(c"interval_ms");
        out.int(length.to_i64_saturating());
        for (name, interval) in [
            (c"current", &report.current),
            (c"previous", &report.previous),
        ] {
            out.name(name);
            match interval {
                None => out.null(),
                Some(interval) => {
                    out.map(4);
                    out.name(c"start_ms");
                    out.int(interval.start.to_i64_saturating());
                    out.name(c"denials");
                    out.int(interval.sketch.offered() as i64);
                    out.name(c"max_error");
                    out.int((interval.sketch.offered() / size.max(1) as u64) as i64);
                    out.name(c"keys");
                    let top = interval.sketch.top(count);
                    out.array(top.len());
                    for hitter in top {
                        out.map(3);
                        out.name(c"key");
                        out.bulk(&hitter.key);
                        out.name(c"denied");
                        out.int(hitter.count as i64);
                        out.name(c"error");
                        out.int(hitter.error as i64);
                    }
                }
            }
        }
    });
    valkey_module::raw::Status::Ok as c_int
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_roll_over_and_quiet_ones_are_empty() {
        let mut r = Report::default();
        let minute = Millis(60_000);
        r.roll(Millis(125_000), 4, minute);
        r.current.as_mut().unwrap().sketch.offer(b"a");
        assert_eq!(r.current.as_ref().unwrap().start, Millis(120_000));
        r.roll(Millis(185_000), 4, minute);
        assert_eq!(r.previous.as_ref().unwrap().sketch.offered(), 1);
        assert_eq!(r.current.as_ref().unwrap().start, Millis(180_000));
        // Two intervals later: the previous one was quiet.
        r.roll(Millis(305_000), 4, minute);
        let previous = r.previous.as_ref().unwrap();
        assert_eq!(
            (previous.start, previous.sketch.offered()),
            (Millis(240_000), 0)
        );
        // A new size starts anew.
        r.roll(Millis(306_000), 8, minute);
        assert!(r.previous.is_none());
    }
}
