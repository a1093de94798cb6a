//! One limiter of any algorithm, as stored under a key, and the effects that
//! change it. An effect is what replication and the AOF carry: applying it
//! needs no clock and no decision, so every copy reaches the same state.

use super::gcra::{self, Gcra};
use super::sliding_log::{self, LogRecord, SlidingLog};
use super::token_bucket::{self, TokenBucket};
use super::window::{self, Window};
use super::{Millis, Outcome};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limiter {
    TokenBucket(TokenBucket),
    FixedWindow(Window),
    SlidingWindow(Window),
    SlidingLog(Box<SlidingLog>),
    Gcra(Gcra),
}

/// The algorithms, for WRONGTYPE errors and the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    SlidingLog = 4,
    Gcra = 5,
}

impl Algorithm {
    pub fn description(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "a token bucket (RL.TOKENBUCKET)",
            Algorithm::FixedWindow => "a fixed window (RL.WINDOW)",
            Algorithm::SlidingWindow => "a sliding window counter (RL.WINDOW ... SLIDING)",
            Algorithm::SlidingLog => "a sliding log (RL.SLIDINGLOG)",
            Algorithm::Gcra => "a GCRA limiter (RL.GCRA, RL.THROTTLE, CL.THROTTLE)",
        }
    }
}

/// A state change to apply to a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Store this limiter (created or updated), replacing what is there.
    Replace(Limiter),
    /// Log one request in a sliding log, creating the log if it is absent:
    /// O(1) bytes however long the log is.
    LogRecord(LogRecord),
}

impl Limiter {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limiter::TokenBucket(_) => Algorithm::TokenBucket,
            Limiter::FixedWindow(_) => Algorithm::FixedWindow,
            Limiter::SlidingWindow(_) => Algorithm::SlidingWindow,
            Limiter::SlidingLog(_) => Algorithm::SlidingLog,
            Limiter::Gcra(_) => Algorithm::Gcra,
        }
    }

    /// The moment the limiter is back to its initial state; its key expires
    /// then, so idle limiters cost nothing. A pure function of the state, so
    /// primary, replicas and AOF replay agree on it.
    pub fn expires_at(&self) -> Millis {
        match self {
            Limiter::TokenBucket(bucket) => bucket.full_at(),
            Limiter::FixedWindow(window) => window.empty_at(false),
            Limiter::SlidingWindow(window) => window.empty_at(true),
            Limiter::SlidingLog(log) => log.empty_at(),
            Limiter::Gcra(gcra) => gcra.full_at(),
        }
    }

    /// The limiter's state at `now` under its own parameters, as a peek
    /// (`COST 0`) would report it.
    pub fn peek(&self, now: Millis) -> Outcome {
        match self {
            Limiter::TokenBucket(bucket) => {
                token_bucket::decide(Some(bucket), bucket.params, now, 0).0
            }
            Limiter::FixedWindow(w) => window::decide(Some(w), w.params, false, now, 0).0,
            Limiter::SlidingWindow(w) => window::decide(Some(w), w.params, true, now, 0).0,
            Limiter::SlidingLog(log) => sliding_log::decide(Some(log), log.params, now, 0, false).0,
            Limiter::Gcra(g) => gcra::decide(Some(g), g.params(), now, 0).0.outcome(),
        }
    }

    /// Bytes this limiter holds on the heap besides its own allocation.
    pub fn heap_capacity(&self) -> usize {
        match self {
            Limiter::SlidingLog(log) => std::mem::size_of::<SlidingLog>() + log.heap_capacity(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_fits_in_one_small_allocation() {
        // Token bucket, window and GCRA states are stored inline; only the log
        // is boxed. 48 bytes is one allocation class; 56 would cost 64.
        assert!(
            std::mem::size_of::<Limiter>() <= 48,
            "{}",
            std::mem::size_of::<Limiter>()
        );
    }
}
