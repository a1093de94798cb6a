//! The binary format of limiters and effects: used for RDB, DUMP/RESTORE,
//! MIGRATE, the AOF rewrite, replication and DEBUG DIGEST-VALUE. Decoding is
//! strict: a payload is client input (RESTORE), so anything this code could
//! not have written is refused, never trusted.
//!
//! Layout: a format version byte, a kind byte, then little-endian u64 fields;
//! a sliding log has its entry count, then its entries as (gap, count) varint
//! pairs, the first gap counted from time 0; a GCRA limiter has its interval
//! rule (0 exact, 1 redis-cell) and its TAT in nanoseconds as two words; a
//! lease limiter has its lease count, then (id, expiry, cost) per lease; a
//! calendar window has its limit, period start and end, count, unit,
//! anchor, then its zone name's length and bytes.

use super::calendar::{Calendar, Unit, ZoneName};
use super::calendar_window::{CalendarParams, CalendarWindow};
use super::gcra::{Gcra, GcraParams, Interval};
use super::lease::{Lease, LeaseChange, LeaseId, Leases, MAX_LEASE_LIMIT};
use super::limiter::{Algorithm, Effect, Limiter, Locked};
use super::sliding_log::{LogParams, LogRecord, SlidingLog};
use super::time::Nanos;
use super::token_bucket::{TokenBucket, TokenBucketParams};
use super::window::{Window, WindowParams};
use super::{bounds, varint, Millis, MAX_TIME};

pub const FORMAT_VERSION: u8 = 1;
const LOG_RECORD: u8 = 0x80;
const LOG_REFUND: u8 = 0x81;
const LEASE_GRANT: u8 = 0x82;
const LEASE_RELEASE: u8 = 0x83;
const LEASE_EXTEND: u8 = 0x84;
/// A locked limiter: `until`, then the inner limiter's own encoding.
const LOCKED: u8 = 6;

fn put(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u64(&mut self) -> Option<u64> {
        let end = self.pos.checked_add(8)?;
        let word = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }

    fn u8(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    fn count(&mut self) -> Option<u64> {
        self.u64().filter(|n| bounds::is_count(*n))
    }

    fn period(&mut self) -> Option<Millis> {
        self.u64().map(Millis).filter(|p| bounds::is_period(*p))
    }

    fn time(&mut self) -> Option<Millis> {
        self.u64().map(Millis).filter(|t| bounds::is_anchor(*t))
    }

    fn deadline(&mut self) -> Option<Millis> {
        self.u64().map(Millis).filter(|t| bounds::is_deadline(*t))
    }

    fn lease_count(&mut self) -> Option<u64> {
        self.u64().filter(|n| (1..=MAX_LEASE_LIMIT).contains(n))
    }

    fn bytes(&mut self, len: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(len)?;
        let bytes = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    fn varint(&mut self) -> Option<u64> {
        varint::read(self.bytes, &mut self.pos)
    }

    fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

pub fn encode_limiter(limiter: &Limiter, out: &mut Vec<u8>) {
    out.push(FORMAT_VERSION);
    if let Limiter::Locked(locked) = limiter {
        out.push(LOCKED);
        put(out, locked.until.0);
        encode_limiter(&locked.inner, out);
        return;
    }
    out.push(limiter.algorithm() as u8);
    match limiter {
        Limiter::TokenBucket(bucket) => {
            put(out, bucket.params.capacity);
            put(out, bucket.params.refill_amount);
            put(out, bucket.params.refill_period.0);
            put(out, bucket.last.0);
            let level = bucket.level();
            put(out, (level >> 64) as u64);
            put(out, level as u64);
        }
        Limiter::FixedWindow(window) | Limiter::SlidingWindow(window) => {
            put(out, window.params.limit);
            put(out, window.params.period.0);
            put(out, window.start.0);
            put(out, window.previous);
            put(out, window.current);
        }
        Limiter::SlidingLog(log) => {
            put(out, log.params.limit);
            put(out, log.params.period.0);
            put(out, log.last_update().0);
            put(out, log.entries().count() as u64);
            let mut previous = None;
            for (time, count) in log.entries() {
                // The oldest entry carries its absolute time, the others their gap.
                let gap = previous.map_or(time.0, |p: Millis| time.0 - p.0);
                varint::push(out, gap);
                varint::push(out, count);
                previous = Some(time);
            }
        }
        Limiter::Gcra(gcra) => {
            put(out, gcra.params().limit);
            put(out, gcra.params().rate);
            put(out, gcra.params().period.0);
            put(out, gcra.params().interval as u64);
            let tat = gcra.tat().0;
            put(out, (tat >> 64) as u64);
            put(out, tat as u64);
        }
        Limiter::Lease(leases) => {
            put(out, leases.limit);
            put(out, leases.last_update().0);
            put(out, leases.held().len() as u64);
            for lease in leases.held() {
                put(out, lease.id.0);
                put(out, lease.expires_at.0);
                put(out, lease.cost);
            }
        }
        Limiter::CalendarWindow(window) => {
            let calendar = window.params.calendar;
            put(out, window.params.limit);
            put(out, window.start.0);
            put(out, window.end.0);
            put(out, window.count);
            put(out, calendar.unit as u64);
            put(out, u64::from(calendar.anchor));
            let zone = calendar.zone.as_bytes();
            put(out, zone.len() as u64);
            out.extend_from_slice(zone);
        }
        Limiter::Locked(_) => {}
    }
}

/// How strictly a stored limiter is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loading {
    /// Refuse anything no command could have written (RESTORE, RL.APPLY).
    Strict,
    /// As strict, but a value that an earlier version accepted and this one
    /// refuses (a lease limiter holding more than its limit, a lease longer
    /// than the longest TTL, a locked GCRA limiter behind its lock: only a
    /// RESTORE of a crafted payload made them) is brought within the bounds
    /// instead, so that a file written by that version still loads whole
    /// (RDB and AOF loading, a replica's full sync).
    Repair,
}

pub fn decode_limiter(bytes: &[u8]) -> Option<Limiter> {
    decode_limiter_with(bytes, Loading::Strict)
}

/// A limiter read from a file: strictly when it can be, else repaired (see
/// [`Loading::Repair`]). The flag says whether it was repaired.
pub fn decode_stored(bytes: &[u8]) -> Option<(Limiter, bool)> {
    match decode_limiter_with(bytes, Loading::Strict) {
        Some(limiter) => Some((limiter, false)),
        None => decode_limiter_with(bytes, Loading::Repair).map(|l| (l, true)),
    }
}

fn decode_limiter_with(bytes: &[u8], loading: Loading) -> Option<Limiter> {
    let mut r = Reader { bytes, pos: 0 };
    if r.u8()? != FORMAT_VERSION {
        return None;
    }
    let kind = r.u8()?;
    let limiter = match kind {
        k if k == Algorithm::TokenBucket as u8 => {
            let params = TokenBucketParams {
                capacity: r.count()?,
                refill_amount: r.count()?,
                refill_period: r.period()?,
            };
            let last = r.time()?;
            let level = (u128::from(r.u64()?) << 64) | u128::from(r.u64()?);
            Limiter::TokenBucket(TokenBucket::restored(params, last, level)?)
        }
        k if k == Algorithm::FixedWindow as u8 || k == Algorithm::SlidingWindow as u8 => {
            let sliding = k == Algorithm::SlidingWindow as u8;
            let window = Window {
                params: WindowParams {
                    limit: r.count()?,
                    period: r.period()?,
                },
                start: r.time()?,
                previous: r.u64()?,
                current: r.u64()?,
            };
            if !window.is_valid(sliding) {
                return None;
            }
            if sliding {
                Limiter::SlidingWindow(window)
            } else {
                Limiter::FixedWindow(window)
            }
        }
        k if k == Algorithm::SlidingLog as u8 => {
            let params = LogParams {
                limit: r.count()?,
                period: r.period()?,
            };
            let last = r.time()?;
            let count = r.u64()?;
            let mut entries = Vec::new();
            let mut time: Option<Millis> = None;
            for _ in 0..count {
                let gap = r.varint()?;
                let count = r.varint()?;
                let at = match time {
                    None => Millis(gap),
                    Some(t) => Millis(t.0.checked_add(gap)?),
                };
                if at > MAX_TIME {
                    return None;
                }
                entries.push((at, count));
                time = Some(at);
            }
            Limiter::SlidingLog(Box::new(SlidingLog::from_entries(params, last, entries)?))
        }
        k if k == Algorithm::Gcra as u8 => {
            let limit = r.count()?;
            let rate = r.count()?;
            let period = r.period()?;
            let interval = match r.u64()? {
                0 => Interval::RoundUp,
                1 => Interval::RedisCell,
                _ => return None,
            };
            let params = GcraParams {
                limit,
                rate,
                period,
                interval,
            };
            let tat = (u128::from(r.u64()?) << 64) | u128::from(r.u64()?);
            Limiter::Gcra(Gcra::restored(params, Nanos(tat))?)
        }
        k if k == Algorithm::Lease as u8 => {
            let limit = r.lease_count()?;
            let last = r.time()?;
            let count = r.u64().filter(|n| *n <= MAX_LEASE_LIMIT)?;
            let mut held = Vec::new();
            for _ in 0..count {
                held.push(Lease {
                    id: LeaseId(r.u64()?),
                    expires_at: r.deadline()?,
                    cost: r.lease_count()?,
                });
            }
            let leases = match loading {
                Loading::Strict => Leases::restored(limit, last, held),
                Loading::Repair => Leases::repaired(limit, last, held),
            };
            Limiter::Lease(Box::new(leases?))
        }
        k if k == Algorithm::CalendarWindow as u8 => {
            let limit = r.count()?;
            let start = r.time()?;
            let end = r.deadline()?;
            let count = r.u64()?;
            let unit = Unit::from_u8(u8::try_from(r.u64()?).ok()?)?;
            let anchor = u8::try_from(r.u64()?).ok()?;
            let len = usize::try_from(r.u64()?).ok()?;
            let zone = ZoneName::from_bytes(r.bytes(len)?)?;
            let window = CalendarWindow {
                params: CalendarParams {
                    limit,
                    calendar: Calendar { unit, anchor, zone },
                },
                start,
                end,
                count,
            };
            if !window.is_valid() {
                return None;
            }
            Limiter::CalendarWindow(Box::new(window))
        }
        LOCKED => {
            let until = r.deadline()?;
            let inner = decode_limiter_with(bytes.get(r.pos..)?, loading)?;
            let locked = match loading {
                Loading::Strict => Locked::restored(until, inner),
                Loading::Repair => Locked::repaired(until, inner),
            };
            return locked.map(|l| Limiter::Locked(Box::new(l)));
        }
        _ => return None,
    };
    r.at_end().then_some(limiter)
}

pub fn encode_effect(effect: &Effect, out: &mut Vec<u8>) {
    match effect {
        Effect::Replace(limiter) => encode_limiter(limiter, out),
        Effect::LogRecord(record) => {
            out.push(FORMAT_VERSION);
            out.push(LOG_RECORD);
            put(out, record.params.limit);
            put(out, record.params.period.0);
            put(out, record.at.0);
            put(out, record.cost);
        }
        Effect::LogRefund { at, amount } => {
            out.push(FORMAT_VERSION);
            out.push(LOG_REFUND);
            put(out, at.0);
            put(out, *amount);
        }
        Effect::Lease(change) => {
            out.push(FORMAT_VERSION);
            match *change {
                LeaseChange::Grant { limit, at, lease } => {
                    out.push(LEASE_GRANT);
                    for word in [limit, at.0, lease.id.0, lease.expires_at.0, lease.cost] {
                        put(out, word);
                    }
                }
                LeaseChange::Release { at, id } => {
                    out.push(LEASE_RELEASE);
                    put(out, at.0);
                    put(out, id.0);
                }
                LeaseChange::Extend { at, id, expires_at } => {
                    out.push(LEASE_EXTEND);
                    put(out, at.0);
                    put(out, id.0);
                    put(out, expires_at.0);
                }
            }
        }
    }
}

pub fn decode_effect(bytes: &[u8]) -> Option<Effect> {
    let kind = *bytes.get(1)?;
    if !(LOG_RECORD..=LEASE_EXTEND).contains(&kind) {
        return decode_limiter(bytes).map(Effect::Replace);
    }
    let mut r = Reader { bytes, pos: 0 };
    if r.u8()? != FORMAT_VERSION {
        return None;
    }
    r.u8()?;
    let effect = if kind >= LEASE_GRANT {
        let change = match kind {
            LEASE_GRANT => LeaseChange::Grant {
                limit: r.lease_count()?,
                at: r.time()?,
                lease: Lease {
                    id: LeaseId(r.u64()?),
                    expires_at: r.deadline()?,
                    cost: r.lease_count()?,
                },
            },
            LEASE_RELEASE => LeaseChange::Release {
                at: r.time()?,
                id: LeaseId(r.u64()?),
            },
            _ => LeaseChange::Extend {
                at: r.time()?,
                id: LeaseId(r.u64()?),
                expires_at: r.deadline()?,
            },
        };
        // A lease is granted or extended at the change's time, for one TTL.
        let ends = match change {
            LeaseChange::Grant { lease, .. } => Some(lease.expires_at),
            LeaseChange::Extend { expires_at, .. } => Some(expires_at),
            LeaseChange::Release { .. } => None,
        };
        if ends.is_some_and(|end| !bounds::is_deadline_after(change.at(), end)) {
            return None;
        }
        Effect::Lease(change)
    } else if kind == LOG_RECORD {
        Effect::LogRecord(LogRecord {
            params: LogParams {
                limit: r.count()?,
                period: r.period()?,
            },
            at: r.time()?,
            cost: r.count()?,
        })
    } else {
        Effect::LogRefund {
            at: r.time()?,
            amount: r.count()?,
        }
    };
    r.at_end().then_some(effect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::window::Window;

    fn window_at(start: Millis) -> Vec<u8> {
        let window = Window {
            params: WindowParams {
                limit: 10,
                period: Millis(1000),
            },
            start,
            previous: 0,
            current: 1,
        };
        let mut out = Vec::new();
        encode_limiter(&Limiter::FixedWindow(window), &mut out);
        out
    }

    #[test]
    fn refuses_times_beyond_max_time() {
        assert!(decode_limiter(&window_at(MAX_TIME)).is_some());
        assert!(decode_limiter(&window_at(Millis(MAX_TIME.0 + 1))).is_none());
        // A log whose second entry lies beyond MAX_TIME (its gap would not
        // survive the `gap << 1` encoding).
        let mut log = vec![FORMAT_VERSION, Algorithm::SlidingLog as u8];
        for word in [10, 1000, 1u64 << 63, 2] {
            log.extend_from_slice(&word.to_le_bytes());
        }
        for value in [0, 1, 1u64 << 63, 1] {
            varint::push(&mut log, value);
        }
        assert!(decode_limiter(&log).is_none());
    }
}
