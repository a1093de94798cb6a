//! The functional core: every algorithm is a pure function of (state,
//! parameters, now, cost) that returns a decision and the effect to apply.
//! Nothing here knows about Valkey; time is passed in as a number.

pub mod bounds;
pub mod calendar;
pub mod calendar_window;
pub mod codec;
pub mod gcra;
pub mod heavy_hitters;
pub mod inspect;
pub mod lease;
pub mod limiter;
#[cfg(test)]
mod model_tests;
pub mod policy;
pub mod sliding_log;
pub mod slot;
pub mod time;
pub mod token_bucket;
pub mod varint;
pub mod window;

pub use time::Millis;

pub use bounds::{MAX_COUNT, MAX_PERIOD, MAX_TIME, MIN_PERIOD};

/// When a denied request could be allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfter {
    /// After this many milliseconds (0 when the request was allowed).
    After(Millis),
    /// Never: the request costs more than the limiter can ever hold.
    Never,
}

impl RetryAfter {
    pub fn to_reply(self) -> i64 {
        match self {
            RetryAfter::After(ms) => ms.to_i64_saturating(),
            RetryAfter::Never => -1,
        }
    }
}

/// What a request gets told; maps one-to-one onto the command's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after: RetryAfter,
    pub reset_after: Millis,
}

impl Outcome {
    /// This outcome answered as allowed with no wait (shadow mode): the
    /// counts stay what the limiter decided.
    pub fn passed(self) -> Outcome {
        Outcome {
            allowed: true,
            retry_after: RetryAfter::After(Millis::ZERO),
            ..self
        }
    }
}

/// The time point `at` as a duration from `now`, never negative.
pub(crate) fn until(at: Millis, now: Millis) -> Millis {
    at.saturating_sub(now)
}
