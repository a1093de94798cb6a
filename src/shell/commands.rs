//! The one command pipeline every limiter command goes through: read the
//! key, let the core decide, commit the effect (apply, propagate, signal:
//! replication.rs), reply. Each algorithm's rules live in `core`; the
//! commands that parse their arguments into a policy are above this file
//! (limiters.rs, leases.rs, stored.rs), and so is BLOCK (blocking.rs), which
//! runs a waiter's attempts through `run_policy` too.

use std::ffi::c_int;

use super::ffi::{self, Ctx, Key, Slot, Str, Value};
use super::keytype::raw_type;
use super::{controls, lease_ids, metrics, policy_stats, replication};
use crate::args::Options;
use crate::core::lease::LeaseId;
use crate::core::limiter::{Algorithm, Effect, Limiter};
use crate::core::policy::Policy;
use crate::core::{Millis, Outcome, RetryAfter};

pub(super) fn fail(ctx: Ctx, message: &str) -> c_int {
    metrics::record_error();
    ffi::reply_error(ctx, message)
}

/// What a command answers: the standard five fields (plus `granted` with
/// PARTIAL), or redis-cell's array.
pub enum Answer {
    Standard(Outcome),
    Partial(Outcome, u64),
    /// RL.LEASE: the granted lease's id and time to live, when one is.
    Lease(Outcome, Option<(LeaseId, Millis)>),
    RedisCell([i64; 5]),
}

impl From<Outcome> for Answer {
    fn from(outcome: Outcome) -> Answer {
        Answer::Standard(outcome)
    }
}

impl Answer {
    fn outcome(&self) -> Option<&Outcome> {
        match self {
            Answer::Standard(outcome) | Answer::Partial(outcome, _) | Answer::Lease(outcome, _) => {
                Some(outcome)
            }
            Answer::RedisCell(_) => None,
        }
    }

    fn allowed(&self) -> bool {
        match self {
            Answer::RedisCell(fields) => fields[0] == 0,
            other => other.outcome().is_some_and(|o| o.allowed),
        }
    }

    /// The BRIEF reply: 0 when allowed, else the wait in ms (at least 1),
    /// -1 when the request can never be allowed.
    fn brief(&self) -> i64 {
        match self {
            Answer::Standard(outcome) | Answer::Partial(outcome, _) | Answer::Lease(outcome, _) => {
                brief(outcome)
            }
            // CL.THROTTLE takes no options: never asked.
            Answer::RedisCell(fields) => -fields[0],
        }
    }

    /// Denied because earlier waiters come first: a lease granted here is
    /// not taken (the key was opened read-only), and the wait is at least 1 ms.
    fn held_back(self) -> Answer {
        let deny = |outcome: Outcome| Outcome {
            allowed: false,
            retry_after: match outcome.retry_after {
                RetryAfter::After(wait) => RetryAfter::After(wait.max(Millis(1))),
                never => never,
            },
            ..outcome
        };
        match self {
            Answer::Standard(outcome) => Answer::Standard(deny(outcome)),
            Answer::Partial(outcome, _) => Answer::Partial(deny(outcome), 0),
            Answer::Lease(outcome, _) => Answer::Lease(deny(outcome), None),
            cell => cell,
        }
    }

    /// A denial answered as allowed (shadow mode): the whole request passes,
    /// as it would with no limiter; the counts are what the limiter decided.
    fn shadowed(self, cost: u64) -> Answer {
        match self {
            Answer::Standard(outcome) => Answer::Standard(outcome.passed()),
            Answer::Partial(outcome, _) => Answer::Partial(outcome.passed(), cost),
            // A lease denied in shadow mode holds no slot: there is no id to give.
            Answer::Lease(outcome, lease) => Answer::Lease(outcome.passed(), lease),
            Answer::RedisCell(mut fields) => {
                fields[0] = 0;
                fields[3] = -1;
                Answer::RedisCell(fields)
            }
        }
    }
}

/// How a denial may end a call.
#[derive(Clone, Copy, Debug)]
pub enum Turn {
    /// Answer now, allowed or not.
    Final,
    /// BLOCK: a denial that a wait could turn into a grant is not answered;
    /// the caller waits, until `deadline` at the latest (None: no timeout).
    MayWait { deadline: Option<Millis> },
    /// A waiter whose time ran out behind earlier ones: answered denied
    /// without taking anything, whatever is free (it is theirs first).
    Behind,
}

/// What an attempt came to.
pub enum Attempt {
    /// Answered (or failed); the status to return.
    Done(c_int),
    /// Denied for now, nothing written or answered: try again at `at`. The
    /// key's expiry then, to tell a key that expired from one moved away.
    Wait {
        at: Millis,
        key_expiry: Option<Millis>,
    },
}

impl Attempt {
    pub fn done(self) -> c_int {
        match self {
            Attempt::Done(status) => status,
            // Only a MayWait turn waits.
            Attempt::Wait { .. } => raw_ok(),
        }
    }
}

fn raw_ok() -> c_int {
    valkey_module::raw::Status::Ok as c_int
}

/// When a waiting caller should try again, or None to answer the denial now.
/// A time-based limiter's wait is exact, so a permit that cannot come before
/// the deadline is refused at once (as Guava's and Bucket4j's tryAcquire
/// with a timeout do); a lease can be released any time, so a lease waiter
/// waits until its deadline.
fn wake_at(
    algorithm: Algorithm,
    outcome: &Outcome,
    now: Millis,
    deadline: Option<Millis>,
) -> Option<Millis> {
    let RetryAfter::After(wait) = outcome.retry_after else {
        return None;
    };
    let ready = now.saturating_add(wait);
    match deadline {
        None => Some(ready),
        Some(deadline) if ready <= deadline => Some(ready),
        Some(deadline) if algorithm == Algorithm::Lease && now < deadline => Some(deadline),
        Some(_) => None,
    }
}

/// The shared read-decide-write step. `decide` sees the key's limiter (of
/// `algorithm`, or none) and returns the answer and the effect, if any.
pub fn execute<A: Into<Answer>>(
    ctx: Ctx,
    key_name: Str,
    options: Options,
    algorithm: Algorithm,
    (now, turn): (Millis, Turn),
    decide: impl FnOnce(Option<&Limiter>, Millis) -> (A, Option<Effect>),
) -> Attempt {
    // A peek or dry run opens the key read-only: it cannot create or touch it.
    let behind = matches!(turn, Turn::Behind);
    let may_write = !options.dry_run && options.cost > 0 && !behind;
    let mut key = Key::open(ctx, key_name, may_write);
    let slot = match key.as_mut() {
        Some(key) => key.get::<Limiter>(raw_type()),
        None => Slot::Empty,
    };
    let (outcome, effect) = match slot {
        Slot::Foreign => return Attempt::Done(fail(ctx, replication::WRONGTYPE)),
        Slot::Ours(limiter) if limiter.algorithm() != algorithm => {
            let message = format!(
                "WRONGTYPE key holds {}, not {}",
                limiter.algorithm().description(),
                algorithm.description()
            );
            return Attempt::Done(fail(ctx, &message));
        }
        Slot::Ours(limiter) => decide(Some(limiter), now),
        Slot::Empty => decide(None, now),
    };
    let mut answer: Answer = outcome.into();
    if behind {
        answer = answer.held_back();
    }
    if let (Turn::MayWait { deadline }, Some(outcome)) = (turn, answer.outcome()) {
        if !outcome.allowed && !controls::shadow() {
            if let Some(at) = wake_at(algorithm, outcome, now, deadline) {
                let key_expiry = key.as_mut().and_then(Key::expiry);
                return Attempt::Wait { at, key_expiry };
            }
        }
    }
    let effect = effect.filter(|_| may_write);
    let locks = matches!(effect, Some(Effect::Replace(Limiter::Locked(_))));
    if let (Some(effect), Some(key)) = (effect, key.as_mut()) {
        if let Err(message) = replication::commit(ctx, key, key_name, effect) {
            return Attempt::Done(fail(ctx, message));
        }
    }
    let denied = !answer.allowed();
    let shadow = denied && controls::shadow();
    if denied {
        controls::on_denied(ctx, key_name, !may_write);
        if shadow {
            answer = answer.shadowed(options.cost);
        }
    }
    if locks {
        controls::on_locked(ctx, key_name);
    }
    metrics::record(algorithm, answer.allowed());
    let counted = policy_stats::Counted {
        allowed: answer.allowed(),
        denied,
        shadow,
        locked: locks,
    };
    policy_stats::record(options.policy, !may_write, counted);
    if options.brief {
        return Attempt::Done(ffi::reply_integer(ctx, answer.brief()));
    }
    Attempt::Done(match answer {
        Answer::Standard(outcome) => reply(ctx, &outcome),
        Answer::Partial(outcome, granted) => {
            let [a, b, c, d, e] = fields(&outcome);
            ffi::reply_fields(ctx, &[a, b, c, d, e, (c"granted", granted as i64)])
        }
        Answer::Lease(outcome, lease) => lease_reply(ctx, &outcome, lease),
        // redis-cell replies a plain array, under RESP3 too.
        Answer::RedisCell(fields) => ffi::reply_integers(ctx, &fields),
    })
}

/// One integer for BRIEF: 0 allowed, else milliseconds to wait (at least
/// 1, so that it never reads as allowed), -1 never.
pub fn brief(outcome: &Outcome) -> i64 {
    if outcome.allowed {
        0
    } else {
        match outcome.retry_after {
            RetryAfter::Never => -1,
            RetryAfter::After(wait) => wait.to_i64_saturating().max(1),
        }
    }
}

pub fn reply(ctx: Ctx, outcome: &Outcome) -> c_int {
    ffi::reply_fields(ctx, &fields(outcome))
}

/// The standard five fields, named for RESP3.
pub fn fields(outcome: &Outcome) -> [(&'static std::ffi::CStr, i64); 5] {
    [
        (c"allowed", i64::from(outcome.allowed)),
        (c"limit", outcome.limit as i64),
        (c"remaining", outcome.remaining as i64),
        (c"retry_after_ms", outcome.retry_after.to_reply()),
        (c"reset_after_ms", outcome.reset_after.to_i64_saturating()),
    ]
}

/// RL.LEASE's reply: the five standard fields, then `lease_id` (nil when no
/// lease was granted) and `lease_ttl_ms` (0 then).
fn lease_reply(ctx: Ctx, outcome: &Outcome, lease: Option<(LeaseId, Millis)>) -> c_int {
    let [a, b, c, d, e] = fields(outcome).map(|(name, n)| (name, Value::Int(n)));
    let hex = lease.map(|(id, _)| id.to_hex());
    let id = match &hex {
        Some(hex) => Value::Bulk(hex),
        None => Value::Null,
    };
    let ttl = lease.map_or(0, |(_, ttl)| ttl.to_i64_saturating());
    ffi::reply_values(
        ctx,
        &[
            a,
            b,
            c,
            d,
            e,
            (c"lease_id", id),
            (c"lease_ttl_ms", Value::Int(ttl)),
        ],
    )
}

/// One policy on one key: the single-limiter commands, and the attempts of
/// a waiting one (`blocking`).
pub fn run_policy(
    ctx: Ctx,
    key_name: Str,
    policy: Policy,
    options: Options,
    when: (Millis, Turn),
) -> Attempt {
    execute(
        ctx,
        key_name,
        options,
        policy.algorithm(),
        when,
        |state, now| {
            let policy = match policy {
                Policy::Lease { params, .. } => Policy::Lease {
                    params,
                    id: lease_ids::fresh_id(state),
                },
                other => other,
            };
            let decision = policy.decide_request(state, now, options.request());
            let answer = match policy {
                Policy::Lease { params, id } => {
                    // A dry run decides a grant but stores none: no id to give.
                    let granted =
                        !options.dry_run && matches!(decision.effect, Some(Effect::Lease(_)));
                    Answer::Lease(decision.outcome, granted.then_some((id, params.ttl)))
                }
                _ if options.partial => Answer::Partial(decision.outcome, decision.granted),
                _ => Answer::Standard(decision.outcome),
            };
            (answer, decision.effect)
        },
    )
}
