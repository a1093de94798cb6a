//! A policy is one algorithm with its parameters: what a command's arguments
//! describe. Deciding a policy on a key's limiter is the one place that maps
//! an algorithm onto its pure `decide`; the single-limiter commands and
//! RL.ALL both go through it.

use super::gcra::{self, GcraParams};
use super::limiter::{Algorithm, Effect, Limiter};
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
}

impl Policy {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Policy::TokenBucket(_) => Algorithm::TokenBucket,
            Policy::Window { sliding: false, .. } => Algorithm::FixedWindow,
            Policy::Window { sliding: true, .. } => Algorithm::SlidingWindow,
            Policy::SlidingLog { .. } => Algorithm::SlidingLog,
            Policy::Gcra(_) => Algorithm::Gcra,
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
        }
    }

    /// Whether an effect this policy returned for a request it denied still
    /// belongs in the state when a compound call is denied: only a
    /// COUNTDENIED log's record of a request that log denied itself.
    fn keeps_denied_effect(&self, outcome: &Outcome) -> bool {
        matches!(
            self,
            Policy::SlidingLog {
                count_denied: true,
                ..
            }
        ) && !outcome.allowed
    }
}

/// What RL.ALL answers: the overall decision and each limiter's own outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compound {
    pub allowed: bool,
    /// After this wait, with no other traffic, the same call is allowed
    /// (each limiter's own wait only ever shrinks, so the longest one);
    /// Never when one limiter can never allow it.
    pub retry_after: RetryAfter,
    pub outcomes: Vec<Outcome>,
}

/// One request against several limiters, all or nothing: the effects are
/// returned (in order, one per limiter) only when every limiter allows it;
/// otherwise none, except a COUNTDENIED log's record of its own denial. In a
/// denied call, the limiters that would have allowed it report their state
/// as it stays, unconsumed (their `COST 0` outcome), so `remaining` is what
/// is really left.
pub fn decide_all(
    policies: &[Policy],
    states: &[Option<&Limiter>],
    now: Millis,
    cost: u64,
) -> (Compound, Vec<Option<Effect>>) {
    let mut outcomes = Vec::with_capacity(policies.len());
    let mut effects = Vec::with_capacity(policies.len());
    for (policy, state) in policies.iter().zip(states) {
        let (outcome, effect) = policy.decide(*state, now, cost);
        outcomes.push(outcome);
        effects.push(effect);
    }
    let allowed = outcomes.iter().all(|o| o.allowed);
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
        for (i, policy) in policies.iter().enumerate() {
            if !policy.keeps_denied_effect(&outcomes[i]) {
                effects[i] = None;
            }
            if outcomes[i].allowed {
                outcomes[i] = policy.decide(states[i], now, 0).0;
            }
        }
    }
    (
        Compound {
            allowed,
            retry_after,
            outcomes,
        },
        effects,
    )
}
