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

impl Default for Compound {
    /// Nothing decided yet: `decide_all` sets every field.
    fn default() -> Self {
        Compound {
            allowed: false,
            retry_after: RetryAfter::Never,
            granted: 0,
            outcomes: PerLimiter::new(),
        }
    }
}

/// One entry per limiter of an RL.ALL call: inline up to four, the common
/// case, so deciding allocates nothing.
pub type PerLimiter<T> = smallvec::SmallVec<[T; 4]>;

/// One request against several limiters, all or nothing: the effects are
/// written (in order, one per limiter) only when every limiter allows it.
/// When the call is denied, a limiter that denied it does what it would do
/// alone (a COUNTDENIED log logs it, LOCKOUT locks it, new token bucket
/// parameters are stored) and the limiters that would have allowed it are
/// untouched and report their state as it stays (their `COST 0` outcome), so
/// `remaining` is what is really left. With PARTIAL every limiter is asked
/// for the least that all of them have.
///
/// Written into `compound` and `effects` (their lists cleared first), where
/// the caller keeps them: returning the lists would copy them, on every call.
#[inline]
pub fn decide_all(
    policies: &[Policy],
    states: &[Option<&Limiter>],
    now: Millis,
    request: Request,
    compound: &mut Compound,
    effects: &mut PerLimiter<Option<Effect>>,
) {
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
    let outcomes = &mut compound.outcomes;
    outcomes.clear();
    effects.clear();
    for (policy, state) in policies.iter().zip(states) {
        let decision = policy.decide_request(*state, now, request);
        outcomes.push(decision.outcome);
        effects.push(decision.effect);
    }
    let allowed = outcomes.iter().all(|o: &Outcome| o.allowed);
    let retry_after =
        outcomes
            .iter()
            .map(|o| o.retry_after)
            .fold(RetryAfter::After(Millis::ZERO), |worst, r| {
                match (worst, r) {
                    (RetryAfter::Never, _) | (_, RetryAfter::Never) => RetryAfter::Never,
                    (RetryAfter::After(a), RetryAfter::After(b)) => RetryAfter::After(a.max(b)),
                }
            });
    if !allowed {
        // Nothing is taken: a limiter that would have allowed reports what
        // it holds as it stands.
        let peek = Request { cost: 0, ..request };
        let each = policies
            .iter()
            .zip(states)
            .zip(outcomes.iter_mut())
            .zip(effects.iter_mut());
        for (((policy, state), outcome), effect) in each {
            if outcome.allowed {
                *outcome = policy.decide_request(*state, now, peek).outcome;
                *effect = None;
            }
        }
    }
    compound.allowed = allowed;
    compound.retry_after = retry_after;
    compound.granted = if allowed { request.cost } else { 0 };
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis(1_000_000);

    fn bucket(capacity: u64) -> Policy {
        Policy::TokenBucket(TokenBucketParams {
            capacity,
            refill_amount: 1,
            refill_period: Millis(1000),
        })
    }

    fn window(limit: u64) -> Policy {
        Policy::Window {
            params: WindowParams {
                limit,
                period: Millis(60_000),
            },
            sliding: false,
        }
    }

    fn request(cost: u64) -> Request {
        Request {
            cost,
            ..Request::default()
        }
    }

    /// Applies every effect to its state, as the shell does.
    fn applied(states: &mut [Option<Limiter>], effects: PerLimiter<Option<Effect>>) {
        for (state, effect) in states.iter_mut().zip(effects) {
            let Some(effect) = effect else { continue };
            match state {
                Some(limiter) => limiter.apply(effect).unwrap(),
                None => *state = Limiter::from_effect(effect).unwrap(),
            }
        }
    }

    fn decide(
        policies: &[Policy],
        states: &[Option<Limiter>],
        cost: u64,
    ) -> (Compound, PerLimiter<Option<Effect>>) {
        let refs: Vec<Option<&Limiter>> = states.iter().map(Option::as_ref).collect();
        decided(policies, &refs, request(cost))
    }

    fn decided(
        policies: &[Policy],
        states: &[Option<&Limiter>],
        request: Request,
    ) -> (Compound, PerLimiter<Option<Effect>>) {
        let (mut compound, mut effects) = (Compound::default(), PerLimiter::new());
        decide_all(policies, states, NOW, request, &mut compound, &mut effects);
        (compound, effects)
    }

    #[test]
    fn all_allowed_takes_from_every_limiter() {
        let policies = [bucket(3), window(5)];
        let mut states = [None, None];
        let (compound, effects) = decide(&policies, &states, 2);
        assert!(compound.allowed);
        assert_eq!(compound.granted, 2);
        assert_eq!(compound.retry_after, RetryAfter::After(Millis::ZERO));
        let remaining: Vec<u64> = compound.outcomes.iter().map(|o| o.remaining).collect();
        assert_eq!(remaining, [1, 3]);
        assert!(effects.iter().all(Option::is_some));
        applied(&mut states, effects);
        let (again, _) = decide(&policies, &states, 0);
        let remaining: Vec<u64> = again.outcomes.iter().map(|o| o.remaining).collect();
        assert_eq!(remaining, [1, 3]);
    }

    #[test]
    fn one_denial_takes_nothing_anywhere() {
        // The bucket has 3, the window 5: a cost of 4 fits only the window.
        let policies = [bucket(3), window(5)];
        let states = [None, None];
        let (compound, effects) = decide(&policies, &states, 4);
        assert!(!compound.allowed);
        assert_eq!(compound.granted, 0);
        assert!(!compound.outcomes[0].allowed);
        // The window would have allowed: it reports what it holds, untouched.
        assert!(compound.outcomes[1].allowed);
        assert_eq!(compound.outcomes[1].remaining, 5);
        assert!(effects.iter().all(Option::is_none));
        // 4 tokens of a bucket of 3 never fit.
        assert_eq!(compound.retry_after, RetryAfter::Never);
    }

    #[test]
    fn the_longest_wait_is_the_answer() {
        let policies = [bucket(1), window(1)];
        let mut states = [None, None];
        let (_, effects) = decide(&policies, &states, 1);
        applied(&mut states, effects);
        let (compound, effects) = decide(&policies, &states, 1);
        assert!(!compound.allowed);
        let waits: Vec<RetryAfter> = compound.outcomes.iter().map(|o| o.retry_after).collect();
        // The bucket refills in 1 s; the window (60 s, aligned) ends later.
        let worst = waits.iter().copied().max_by_key(|w| match w {
            RetryAfter::After(ms) => ms.0,
            RetryAfter::Never => u64::MAX,
        });
        assert_eq!(Some(compound.retry_after), worst);
        assert_eq!(compound.retry_after, waits[1]);
        assert!(effects.iter().all(Option::is_none));
    }

    #[test]
    fn lists_given_with_entries_are_replaced_not_appended_to() {
        let policies = [bucket(3), window(5)];
        let refs = [None, None];
        let (fresh, fresh_effects) = decided(&policies, &refs, request(1));
        // A denial first: its verdict, wait and outcomes must all be replaced.
        let (mut reused, mut reused_effects) = decided(&policies, &refs, request(4));
        assert!(!reused.allowed);
        decide_all(
            &policies,
            &refs,
            NOW,
            request(1),
            &mut reused,
            &mut reused_effects,
        );
        assert_eq!(reused, fresh);
        assert_eq!(reused_effects, fresh_effects);
    }

    #[test]
    fn partial_grants_the_least_any_limiter_has() {
        let policies = [bucket(3), window(5)];
        let states = [None, None];
        let refs = [None, None];
        let partial = Request {
            cost: 10,
            partial: true,
            lockout: None,
        };
        let (compound, effects) = decided(&policies, &refs, partial);
        assert!(compound.allowed);
        assert_eq!(compound.granted, 3);
        let mut states = states;
        applied(&mut states, effects);
        let (after, _) = decide(&policies, &states, 0);
        let remaining: Vec<u64> = after.outcomes.iter().map(|o| o.remaining).collect();
        assert_eq!(remaining, [0, 2]);
    }
}
