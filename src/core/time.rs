//! Time as an integer count of milliseconds since the Unix epoch (or a duration
//! in milliseconds). Milliseconds are the unit of every reply field and of key
//! expiry, so deciding in the same unit keeps "wait `retry_after_ms`, then ask
//! again" exact: no rounding stands between the decision and the reply.

/// Milliseconds: a point in time (since the Unix epoch) or a duration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    pub const ZERO: Millis = Millis(0);

    pub fn saturating_add(self, other: Millis) -> Millis {
        Millis(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Millis) -> Millis {
        Millis(self.0.saturating_sub(other.0))
    }

    /// The start of the `period`-long window, aligned to the epoch, that holds `self`.
    pub fn align_down(self, period: Millis) -> Millis {
        Millis(self.0 - self.0 % period.0.max(1))
    }

    /// A duration from a u128 computation, saturating instead of wrapping.
    pub fn from_u128_saturating(value: u128) -> Millis {
        Millis(u64::try_from(value).unwrap_or(u64::MAX))
    }

    /// For replies and expiry: Valkey speaks signed 64-bit integers.
    pub fn to_i64_saturating(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

/// Nanoseconds: the unit of GCRA's theoretical arrival time (a point in time
/// since the Unix epoch, or a duration). Fine enough that an emission
/// interval of one request per nanosecond (10^9 per second) is a whole
/// number, wide enough (u128) for one request per 3650 days with a burst of
/// 10^15.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u128);

pub const NANOS_PER_MILLI: u128 = 1_000_000;

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);

    pub fn from_millis(ms: Millis) -> Nanos {
        Nanos(u128::from(ms.0) * NANOS_PER_MILLI)
    }

    /// Rounded up to whole milliseconds: a client that waits this long has
    /// waited at least the exact duration.
    pub fn ceil_millis(self) -> Millis {
        Millis::from_u128_saturating(self.0.div_ceil(NANOS_PER_MILLI))
    }

    pub fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}
