//! A policy is one algorithm with its parameters: what a command's arguments
//! describe. Deciding a policy on a key's limiter is the one place that maps
//! an algorithm onto its pure `decide`; the single-limiter commands and
//! RL.ALL both go through it.

use super::bounds::{self, clock};
use super::calendar_window::{self, CalendarParams};
use super::gcra::{self, GcraParams};
use super::lease::{self, LeaseId, LeaseParams};
use super::limiter::{Algorithm, Effect, Limiter, Locked};
use super::sliding_log::{self, LogParams};
use super::token_bucket::{self, TokenBucketParams};
use super::window::{self, WindowParams};
use super::{Millis, Outcome, RetryAfter};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    TokenBucket(TokenBucketParams),
    Window {
        params: WindowParams,
        sliding: bool,
    },
    SlidingLog {
        params: LogParams,
        count_denied: bool,
    },
    Gcra(GcraParams),
    /// A fixed window of calendar periods (RL.WINDOW ... day|week|month|year).
    Calendar(CalendarParams),
    /// `id` names the lease when one is granted (the shell picks it).
    Lease {
        params: LeaseParams,
        id: LeaseId,
    },
}

impl Policy {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Policy::TokenBucket(_) => Algorithm::TokenBucket,
            Policy::Window { sliding: false, .. } => Algorithm::FixedWindow,
            Policy::Window { sliding: true, .. } => Algorithm::SlidingWindow,
            Policy::SlidingLog { .. } => Algorithm::SlidingLog,
            Policy::Gcra(_) => Algorithm::Gcra,
            Policy::Calendar(_) => Algorithm::CalendarWindow,
            Policy::Lease { .. } => Algorithm::Lease,
        }
    }

    /// Decides a request of `cost` at `now` on `state`, which the caller has
    /// checked is of this policy's algorithm (or absent).
    pub fn decide(
        &self,
        state: Option<&Limiter>,
        now: Millis,
        cost: u64,
    ) -> (Outcome, Option<Effect>) {
        match *self {
            Policy::TokenBucket(params) => {
                let bucket = match state {
                    Some(Limiter::TokenBucket(b)) => Some(b),
                    _ => None,
                };
                let (outcome, next) = token_bucket::decide(bucket, params, now, cost);
                (
                    outcome,
                    next.map(|b| Effect::Replace(Limiter::TokenBucket(b))),
                )
            }
            Policy::Window { params, sliding } => {
                let current = match state {
                    Some(Limiter::FixedWindow(w) | Limiter::SlidingWindow(w)) => Some(w),
                    _ => None,
                };
                let (outcome, next) = window::decide(current, params, sliding, now, cost);
                let wrap = |w| {
                    if sliding {
                        Limiter::SlidingWindow(w)
                    } else {
                        Limiter::FixedWindow(w)
                    }
                };
                (outcome, next.map(|w| Effect::Replace(wrap(w))))
            }
            Policy::SlidingLog {
                params,
                count_denied,
            } => {
                let log = match state {
                    Some(Limiter::SlidingLog(log)) => Some(log.as_ref()),
                    _ => None,
                };
                let (outcome, record) = sliding_log::decide(log, params, now, cost, count_denied);
                (outcome, record.map(Effect::LogRecord))
            }
            Policy::Gcra(params) => {
                let current = match state {
                    Some(Limiter::Gcra(g)) => Some(g),
                    _ => None,
                };
                let (verdict, next) = gcra::decide(current, params, now, cost);
                (
                    verdict.outcome(),
                    next.map(|g| Effect::Replace(Limiter::Gcra(g))),
                )
            }
            Policy::Calendar(params) => {
                let current = match state {
                    Some(Limiter::CalendarWindow(w)) => Some(w.as_ref()),
                    _ => None,
                };
                let (outcome, next) = calendar_window::decide(current, params, now, cost);
                let effect = next.map(|w| Effect::Replace(Limiter::CalendarWindow(Box::new(w))));
                (outcome, effect)
            }
            Policy::Lease { params, id } => {
                let leases = match state {
                    Some(Limiter::Lease(l)) => Some(l.as_ref()),
                    _ => None,
                };
                let (outcome, granted) = lease::decide(leases, params, now, cost);
                let effect = granted.map(|(at, l)| Effect::Lease(lease::grant(params, at, l, id)));
                (outcome, effect)
            }
        }
    }

    /// Decides a request with its options: a lock in force denies it, PARTIAL
    /// grants what is there, LOCKOUT locks the key when it is denied.
    pub fn decide_request(
        &self,
        state: Option<&Limiter>,
        now: Millis,
        request: Request,
    ) -> Decision {
        let now = clock(now);
        let cost = request.cost;
        if let Some(Limiter::Locked(locked)) = state {
            if now < locked.until {
                return self.locked(locked, now, cost);
            }
        }
        let state = state.map(|s| s.unlocked_at(now));
        let grant = if request.partial && cost > 0 {
            cost.min(self.decide(state, now, 0).0.remaining)
        } else {
            cost
        };
        // Nothing there to grant: asked as one unit, so the denial tells
        // when one will be.
        let asked = if request.partial && cost > 0 {
            grant.max(1)
        } else {
            cost
        };
        let (mut outcome, mut effect) = self.decide(state, now, asked);
        let granted = if outcome.allowed { asked } else { 0 };
        if let (Some(lock), Some(current), false, true) = (
            request.lockout,
            state,
            outcome.allowed,
            cost > 0 && outcome.retry_after != RetryAfter::Never,
        ) {
            let inner = current.with_effect(effect.take());
            let lock = bounds::duration(lock);
            let until = now.saturating_add(lock);
            outcome.retry_after = match outcome.retry_after {
                RetryAfter::After(wait) => RetryAfter::After(wait.max(lock)),
                never => never,
            };
            outcome.reset_after = outcome.reset_after.max(lock);
            effect = Some(Effect::Replace(Limiter::Locked(Box::new(Locked {
                until,
                inner,
            }))));
        }
        Decision {
            outcome,
            granted,
            effect,
        }
    }

    /// A request while a lock is in force: denied (a peek is told the
    /// state), nothing written; the lock is not extended.
    fn locked(&self, locked: &Locked, now: Millis, cost: u64) -> Decision {
        let (inner, _) = self.decide(Some(&locked.inner), now, cost);
        let mut outcome = locked.peek(inner, now);
        if cost > 0 {
            outcome.allowed = false;
            if inner.retry_after != RetryAfter::Never {
                let wait = match inner.retry_after {
                    RetryAfter::After(w) => w,
                    RetryAfter::Never => Millis::ZERO,
                };
                outcome.retry_after = RetryAfter::After(wait.max(locked.until.saturating_sub(now)));
            }
        }
        Decision {
            outcome,
            granted: 0,
            effect: None,
        }
    }
}

/// A request's options, as the core sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub cost: u64,
    /// Grant min(cost, what is there) instead of all or nothing.
    pub partial: bool,
    /// Lock the key for this long when the request is denied.
    pub lockout: Option<Millis>,
}

/// One limiter's decision: its outcome, what it granted, the effect to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    /// Units consumed (0 when denied; with PARTIAL, possibly less than asked).
    pub granted: u64,
    pub effect: Option<Effect>,
}

/// What RL.ALL answers: the overall decision and each limiter's own outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compound {
    pub allowed: bool,
    /// After this wait, with no other traffic, the same call is allowed
    /// (each limiter's own wait only ever shrinks, so the longest one);
    /// Never when one limiter can never allow it.
    pub retry_after: RetryAfter,
    /// What every limiter consumed (with PARTIAL, the least any could give).
    pub granted: u64,
    pub outcomes: PerLimiter<Outcome>,
}

/// One entry per limiter of an RL.ALL call: inline up to four, the common
/// case, so deciding allocates nothing.
pub type PerLimiter<T> = smallvec::SmallVec<[T; 4]>;

/// One request against several limiters, all or nothing: the effects are
/// returned (in order, one per limiter) only when every limiter allows it.
/// When the call is denied, a limiter that denied it does what it would do
/// alone (a COUNTDENIED log logs it, LOCKOUT locks it, new token bucket
/// parameters are stored) and the limiters that would have allowed it are
/// untouched and report their state as it stays (their `COST 0` outcome), so
/// `remaining` is what is really left. With PARTIAL every limiter is asked
/// for the least that all of them have.
pub fn decide_all(
    policies: &[Policy],
    states: &[Option<&Limiter>],
    now: Millis,
    request: Request,
) -> (Compound, PerLimiter<Option<Effect>>) {
    let mut request = request;
    if request.partial && request.cost > 0 {
        let there = policies
            .iter()
            .zip(states)
            .map(|(p, s)| {
                p.decide_request(*s, now, Request { cost: 0, ..request })
                    .outcome
                    .remaining
            })
            .min()
            .unwrap_or(0);
        request.cost = request.cost.min(there).max(1);
        request.partial = false;
    }
    let decisions: PerLimiter<Decision> = policies
        .iter()
        .zip(states)
        .map(|(p, s)| p.decide_request(*s, now, request))
        .collect();
    let allowed = decisions.iter().all(|d| d.outcome.allowed);
    let retry_after = decisions.iter().map(|d| d.outcome.retry_after).fold(
        RetryAfter::After(Millis::ZERO),
        |worst, r| match (worst, r) {
            (RetryAfter::Never, _) | (_, RetryAfter::Never) => RetryAfter::Never,
            (RetryAfter::After(a), RetryAfter::After(b)) => RetryAfter::After(a.max(b)),
        },
    );
    let mut outcomes = PerLimiter::with_capacity(policies.len());
    let mut effects = PerLimiter::with_capacity(policies.len());
    for ((policy, state), decision) in policies.iter().zip(states).zip(decisions) {
        if allowed || !decision.outcome.allowed {
            outcomes.push(decision.outcome);
            effects.push(decision.effect);
        } else {
            outcomes.push(
                policy
                    .decide_request(*state, now, Request { cost: 0, ..request })
                    .outcome,
            );
            effects.push(None);
        }
    }
    let granted = if allowed { request.cost } else { 0 };
    (
        Compound {
            allowed,
            retry_after,
            granted,
            outcomes,
        },
        effects,
    )
}
