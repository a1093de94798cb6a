//! One limiter of any algorithm, as stored under a key, and the effects that
//! change it. An effect is what replication and the AOF carry: applying it
//! needs no clock and no decision, so every copy reaches the same state.

use super::bounds::{self, clock};
use super::calendar_window::{self, CalendarWindow};
use super::gcra::{self, Gcra};
use super::lease::{self, LeaseChange, LeaseParams, Leases};
use super::sliding_log::{self, LogRecord, SlidingLog};
use super::time::Nanos;
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
    /// Boxed: its leases live on the heap anyway.
    Lease(Box<Leases>),
    /// Boxed: its zone name is stored inline (40 bytes).
    CalendarWindow(Box<CalendarWindow>),
    /// A limiter locked out (penalty box) until a time: every request is
    /// denied until then, whatever the limiter holds. Boxed: locks are rare,
    /// and the other limiters keep their 48 bytes.
    Locked(Box<Locked>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locked {
    pub until: Millis,
    /// Never itself `Locked`.
    pub inner: Limiter,
}

/// The algorithms, for WRONGTYPE errors and the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    SlidingLog = 4,
    Gcra = 5,
    /// 6 is taken by the codec's lock marker.
    Lease = 7,
    CalendarWindow = 8,
}

impl Algorithm {
    pub fn description(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "a token bucket (RL.TOKENBUCKET)",
            Algorithm::FixedWindow => "a fixed window (RL.WINDOW)",
            Algorithm::SlidingWindow => "a sliding window counter (RL.WINDOW ... SLIDING)",
            Algorithm::SlidingLog => "a sliding log (RL.SLIDINGLOG)",
            Algorithm::Gcra => "a GCRA limiter (RL.GCRA, RL.THROTTLE, CL.THROTTLE)",
            Algorithm::Lease => "a lease limiter (RL.LEASE)",
            Algorithm::CalendarWindow => {
                "a calendar window (RL.WINDOW ... day, week, month or year)"
            }
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
    /// Give back `amount` of a sliding log's newest cost, as of `at`.
    LogRefund { at: Millis, amount: u64 },
    /// Grant, release or extend one lease of a lease limiter.
    Lease(LeaseChange),
}

impl Limiter {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limiter::TokenBucket(_) => Algorithm::TokenBucket,
            Limiter::FixedWindow(_) => Algorithm::FixedWindow,
            Limiter::SlidingWindow(_) => Algorithm::SlidingWindow,
            Limiter::SlidingLog(_) => Algorithm::SlidingLog,
            Limiter::Gcra(_) => Algorithm::Gcra,
            Limiter::Lease(_) => Algorithm::Lease,
            Limiter::CalendarWindow(_) => Algorithm::CalendarWindow,
            Limiter::Locked(locked) => locked.inner.algorithm(),
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
            Limiter::Lease(leases) => leases.empty_at(),
            Limiter::CalendarWindow(window) => window.empty_at(),
            Limiter::Locked(locked) => locked.until.max(locked.inner.expires_at()),
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
            Limiter::Lease(l) => {
                let params = LeaseParams {
                    limit: l.limit,
                    ttl: Millis(1),
                };
                lease::decide(Some(l), params, now, 0).0
            }
            Limiter::CalendarWindow(w) => calendar_window::decide(Some(w), w.params, now, 0).0,
            Limiter::Locked(locked) => locked.peek(locked.inner.peek(now), now),
        }
    }

    /// Gives back up to `amount` units at `now` (see each algorithm's
    /// `refund`). Returns the effect to apply (none when nothing comes back)
    /// and how much is given back.
    pub fn refund(&self, now: Millis, amount: u64) -> (Option<Effect>, u64) {
        let now = clock(now);
        let (effect, given) = match self {
            Limiter::TokenBucket(b) => {
                let (b, given) = token_bucket::refund(b, now, amount);
                (Effect::Replace(Limiter::TokenBucket(b)), given)
            }
            Limiter::FixedWindow(w) => {
                let (w, given) = window::refund(w, false, now, amount);
                (Effect::Replace(Limiter::FixedWindow(w)), given)
            }
            Limiter::SlidingWindow(w) => {
                let (w, given) = window::refund(w, true, now, amount);
                (Effect::Replace(Limiter::SlidingWindow(w)), given)
            }
            Limiter::SlidingLog(log) => {
                let given = (**log).clone().refund(now, amount);
                (Effect::LogRefund { at: now, amount }, given)
            }
            Limiter::Gcra(g) => {
                let (g, given) = gcra::refund(g, now, amount);
                (Effect::Replace(Limiter::Gcra(g)), given)
            }
            Limiter::CalendarWindow(w) => {
                let (w, given) = calendar_window::refund(w, now, amount);
                (Effect::Replace(Limiter::CalendarWindow(Box::new(w))), given)
            }
            // Slots come back by RL.RELEASE, which names the lease.
            Limiter::Lease(_) => return (None, 0),
            // A refund gives back to the limiter; a lock stays until it ends.
            // The lock was set no earlier than its end minus the longest
            // lockout: a clock reading before that has gone back, and stands
            // still there (as every algorithm treats such a clock), so the
            // limiter never moves back behind the lock's start.
            Limiter::Locked(locked) => {
                let since = bounds::set_no_earlier_than(locked.until);
                let (effect, given) = locked.inner.refund(now.max(since), amount);
                let inner = locked.inner.with_effect(effect);
                let relocked = Limiter::Locked(Box::new(Locked {
                    until: locked.until,
                    inner,
                }));
                (Effect::Replace(relocked), given)
            }
        };
        ((given > 0).then_some(effect), given)
    }

    /// This limiter with `effect` applied; an effect that does not apply
    /// leaves it as it is.
    pub fn with_effect(&self, effect: Option<Effect>) -> Limiter {
        let mut out = self.clone();
        if let Some(effect) = effect {
            let _ = out.apply(effect);
        }
        out
    }

    /// Applies `effect` in place, as the command that made it, replication
    /// and AOF replay all do. Every effect a command makes applies; an
    /// RL.APPLY payload that does not is refused and changes nothing, so a
    /// copy only ever holds states the loader accepts.
    pub fn apply(&mut self, effect: Effect) -> Result<(), ApplyError> {
        // A request logged after a lock ended leaves the lock behind.
        if let (Limiter::Locked(locked), Effect::LogRecord(record)) = (&*self, &effect) {
            if locked.until <= record.at && matches!(locked.inner, Limiter::SlidingLog(_)) {
                *self = locked.inner.clone();
            }
        }
        match (self, effect) {
            (current, Effect::Replace(limiter)) => *current = limiter,
            (Limiter::Lease(leases), Effect::Lease(change)) => {
                if !leases.accepts(&change) {
                    return Err(ApplyError::Refused);
                }
                leases.apply(change);
            }
            (_, Effect::Lease(_)) => return Err(ApplyError::WrongType),
            (Limiter::SlidingLog(log), effect) => apply_to_log(log, &effect),
            (Limiter::Locked(locked), effect) => match &mut locked.inner {
                Limiter::SlidingLog(log) => apply_to_log(log, &effect),
                _ => return Err(ApplyError::WrongType),
            },
            (_, Effect::LogRecord(_) | Effect::LogRefund { .. }) => {
                return Err(ApplyError::WrongType)
            }
        }
        Ok(())
    }

    /// What `effect` creates on a key that holds no limiter: nothing for a
    /// refund, release or extension (there is nothing to give back or keep).
    pub fn from_effect(effect: Effect) -> Result<Option<Limiter>, ApplyError> {
        let limiter = match effect {
            Effect::Replace(limiter) => limiter,
            Effect::LogRecord(record) => {
                let mut log = SlidingLog::new(record.params);
                log.apply(record);
                Limiter::SlidingLog(Box::new(log))
            }
            Effect::Lease(change @ LeaseChange::Grant { limit, .. }) => {
                let mut leases = Leases::new(limit);
                if !leases.accepts(&change) {
                    return Err(ApplyError::Refused);
                }
                leases.apply(change);
                Limiter::Lease(Box::new(leases))
            }
            Effect::LogRefund { .. } | Effect::Lease(_) => return Ok(None),
        };
        Ok(Some(limiter))
    }

    /// A lock whose time has passed is no lock: the limiter it holds.
    pub fn unlocked_at(&self, now: Millis) -> &Limiter {
        match self {
            Limiter::Locked(locked) if locked.until <= now => &locked.inner,
            other => other,
        }
    }

    /// Bytes this limiter holds on the heap besides its own allocation.
    pub fn heap_capacity(&self) -> usize {
        match self {
            Limiter::SlidingLog(log) => std::mem::size_of::<SlidingLog>() + log.heap_capacity(),
            Limiter::Lease(leases) => std::mem::size_of::<Leases>() + leases.heap_capacity(),
            Limiter::CalendarWindow(_) => std::mem::size_of::<CalendarWindow>(),
            Limiter::Locked(locked) => std::mem::size_of::<Locked>() + locked.inner.heap_capacity(),
            _ => 0,
        }
    }
}

/// Why an effect does not apply to a limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// It is for another algorithm.
    WrongType,
    /// It would make a state no command could have made (a lease grant
    /// beyond the limit).
    Refused,
}

impl Locked {
    /// A locked limiter loaded from outside, accepted only when a LOCKOUT
    /// could have made it: its end a deadline, its limiter neither locked
    /// nor a lease limiter (RL.LEASE takes no LOCKOUT). A lock follows a
    /// denial, and a denied GCRA limiter's TAT is ahead of the clock, so a
    /// locked GCRA limiter's TAT is no earlier than the lock's start, at
    /// most the longest lockout before its end; every later change keeps
    /// that (see `Limiter::refund`).
    pub fn restored(until: Millis, inner: Limiter) -> Option<Locked> {
        let valid = bounds::is_deadline(until)
            && match &inner {
                Limiter::Locked(_) | Limiter::Lease(_) => false,
                Limiter::Gcra(g) => {
                    g.tat() >= Nanos::from_millis(bounds::set_no_earlier_than(until))
                }
                _ => true,
            };
        valid.then_some(Locked { until, inner })
    }

    /// A locked limiter an earlier version loaded and this one refuses
    /// (a GCRA limiter whose TAT lies before the lock could have begun),
    /// brought within the bounds: its TAT moves up to that moment, which is
    /// in the past for any lock still in force, so no decision changes.
    pub fn repaired(until: Millis, inner: Limiter) -> Option<Locked> {
        let inner = match inner {
            Limiter::Gcra(g) => {
                let floor = Nanos::from_millis(bounds::set_no_earlier_than(until));
                Limiter::Gcra(g.with_tat_at_least(floor))
            }
            other => other,
        };
        Locked::restored(until, inner)
    }

    /// What a peek of a locked limiter reports: nothing remains until the
    /// lock ends, and it is full no earlier than that.
    pub fn peek(&self, inner: Outcome, now: Millis) -> Outcome {
        if self.until <= now {
            return inner;
        }
        Outcome {
            remaining: 0,
            reset_after: inner.reset_after.max(self.until.saturating_sub(now)),
            ..inner
        }
    }
}

/// Applies a log effect (a record or a refund) to a sliding log; others do
/// not apply to a log. Here rather than in sliding_log.rs, which knows
/// nothing of `Effect`: the log is below the limiter that holds it.
fn apply_to_log(log: &mut SlidingLog, effect: &Effect) {
    match *effect {
        Effect::LogRecord(record) => log.apply(record),
        Effect::LogRefund { at, amount } => {
            log.refund(at, amount);
        }
        Effect::Replace(_) | Effect::Lease(_) => {}
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
