//! The commands on one limiter: RL.TOKENBUCKET, RL.WINDOW, RL.SLIDINGLOG,
//! RL.GCRA, RL.THROTTLE and CL.THROTTLE parse their arguments into a policy
//! and run it through the pipeline (commands.rs), at once or waiting
//! (blocking.rs); RL.REFUND, RL.UNLOCK, RL.PEEK and RL.INSPECT read or change
//! the limiter directly.

use std::ffi::c_int;

use super::commands::{execute, fail, fields, reply, run_policy, Answer, Turn};
use super::ffi::{self, Argv, Ctx, Key, Slot, Str};
use super::keytype::raw_type;
use super::{blocking, metrics, replication, waiters};
use crate::args::{self, ArgError, Options};
use crate::core::gcra::{self, Interval};
use crate::core::inspect::Field;
use crate::core::limiter::{Algorithm, Effect, Limiter};
use crate::core::policy::Policy;

fn parsed<T>(ctx: Ctx, result: Result<T, ArgError>) -> Result<T, c_int> {
    result.map_err(|error| fail(ctx, &error.0))
}

/// A command's first attempt: at once, or waiting with BLOCK.
pub fn start(ctx: Ctx, key_name: Str, policy: Policy, options: Options) -> c_int {
    match options.block {
        Some(timeout) => blocking::start(ctx, key_name, policy, options, timeout),
        None => run_policy(ctx, key_name, policy, options, (ffi::now(), Turn::Final)).done(),
    }
}

/// `RL.TOKENBUCKET key capacity refill_amount refill_period [COST n] [DRYRUN]`
pub fn token_bucket(ctx: Ctx, argv: &[Str]) -> c_int {
    match parsed(ctx, args::token_bucket(&Argv(&argv[2..]))) {
        Ok((params, options)) => start(ctx, argv[1], Policy::TokenBucket(params), options),
        Err(status) => status,
    }
}

/// `RL.WINDOW key limit period [SLIDING] [COST n] [DRYRUN]`
pub fn window(ctx: Ctx, argv: &[Str]) -> c_int {
    match parsed(ctx, args::window(&Argv(&argv[2..]))) {
        Ok((policy, options)) => start(ctx, argv[1], policy, options),
        Err(status) => status,
    }
}

/// `RL.SLIDINGLOG key limit period [COUNTDENIED] [COST n] [DRYRUN]`
pub fn sliding_log(ctx: Ctx, argv: &[Str]) -> c_int {
    match parsed(ctx, args::sliding_log(&Argv(&argv[2..]))) {
        Ok((params, options)) => {
            let policy = Policy::SlidingLog {
                params,
                count_denied: options.flag,
            };
            start(ctx, argv[1], policy, options)
        }
        Err(status) => status,
    }
}

/// `RL.GCRA key burst rate period [COST n] [DRYRUN]`
pub fn gcra(ctx: Ctx, argv: &[Str]) -> c_int {
    match parsed(ctx, args::gcra(&Argv(&argv[2..]))) {
        Ok((params, options)) => start(ctx, argv[1], Policy::Gcra(params), options),
        Err(status) => status,
    }
}

fn quantity(cost: u64) -> Options {
    Options {
        cost,
        ..Options::default()
    }
}

/// `RL.THROTTLE key max_burst count_per_period period [quantity]`: redis-cell's
/// arguments, exact arithmetic, the standard reply. The same limiter as
/// `RL.GCRA key <max_burst + 1> count_per_period period COST quantity`.
pub fn rl_throttle(ctx: Ctx, argv: &[Str]) -> c_int {
    let arguments = args::throttle(&Argv(&argv[2..]), "RL.THROTTLE", Interval::RoundUp);
    match parsed(ctx, arguments) {
        Ok((params, cost)) => {
            let when = (ffi::now(), Turn::Final);
            run_policy(ctx, argv[1], Policy::Gcra(params), quantity(cost), when).done()
        }
        Err(status) => status,
    }
}

/// `CL.THROTTLE key max_burst count_per_period period [quantity]`: redis-cell's
/// command, reply and rounding, on the same stored limiter.
pub fn cl_throttle(ctx: Ctx, argv: &[Str]) -> c_int {
    let arguments = args::throttle(&Argv(&argv[2..]), "CL.THROTTLE", Interval::RedisCell);
    let (params, cost) = match parsed(ctx, arguments) {
        Ok(parsed) => parsed,
        Err(status) => return status,
    };
    let options = quantity(cost);
    let when = (ffi::now(), Turn::Final);
    execute(
        ctx,
        argv[1],
        options,
        Algorithm::Gcra,
        when,
        |state, now| {
            let state = state.map(|s| s.unlocked_at(now));
            if let Some(Limiter::Locked(_)) = state {
                // Locked out (RL.GCRA ... LOCKOUT): limited until the lock ends.
                let decision = Policy::Gcra(params).decide_request(state, now, options.request());
                return (
                    Answer::RedisCell(gcra::locked_cell_reply(&decision.outcome, options.cost)),
                    None,
                );
            }
            let current = match state {
                Some(Limiter::Gcra(g)) => Some(g),
                _ => None,
            };
            let (verdict, next) = gcra::decide(current, params, now, options.cost);
            (
                Answer::RedisCell(verdict.redis_cell_reply()),
                next.map(|g| Effect::Replace(Limiter::Gcra(g))),
            )
        },
    )
    .done()
}

/// `RL.REFUND key amount`: gives back up to `amount` units to the limiter
/// under its own parameters. Replies its state after the refund (the five
/// fields of a peek) plus `refunded`, what came back; nil when the key holds
/// no limiter (it is full: there is nothing to give back).
pub fn refund(ctx: Ctx, argv: &[Str]) -> c_int {
    let amount = match parsed(ctx, args::amount(ffi::bytes(argv[2]))) {
        Ok(amount) => amount,
        Err(status) => return status,
    };
    let Some(mut key) = Key::open(ctx, argv[1], true) else {
        return fail(ctx, "ERR could not open the key for writing");
    };
    let now = ffi::now();
    let (effect, refunded) =
        match key.get::<Limiter>(raw_type()) {
            Slot::Empty => return ffi::reply_null(ctx),
            Slot::Foreign => return fail(ctx, replication::WRONGTYPE),
            Slot::Ours(Limiter::Lease(_)) => return fail(
                ctx,
                "ERR a lease limiter gets its slots back by RL.RELEASE key lease_id, not RL.REFUND",
            ),
            Slot::Ours(limiter) => limiter.refund(now, amount),
        };
    if let Some(effect) = effect {
        if let Err(message) = replication::commit(ctx, &mut key, argv[1], effect) {
            return fail(ctx, message);
        }
    }
    metrics::record_refund(refunded);
    if refunded > 0 {
        waiters::key_changed(ctx, argv[1]);
    }
    let outcome = match key.get::<Limiter>(raw_type()) {
        Slot::Ours(limiter) => limiter.peek(now),
        _ => return ffi::reply_null(ctx),
    };
    let [a, b, c, d, e] = fields(&outcome);
    ffi::reply_fields(ctx, &[a, b, c, d, e, (c"refunded", refunded as i64)])
}

/// `RL.UNLOCK key`: ends a lockout (LOCKOUT) now, keeping the limiter's
/// counts. Replies 1 when a lock was lifted, 0 otherwise.
pub fn unlock(ctx: Ctx, argv: &[Str]) -> c_int {
    let Some(mut key) = Key::open(ctx, argv[1], true) else {
        return fail(ctx, "ERR could not open the key for writing");
    };
    let now = ffi::now();
    let inner = match key.get::<Limiter>(raw_type()) {
        Slot::Foreign => return fail(ctx, replication::WRONGTYPE),
        Slot::Ours(Limiter::Locked(locked)) if locked.until > now => locked.inner.clone(),
        _ => return ffi::reply_integer(ctx, 0),
    };
    if let Err(message) = replication::commit(ctx, &mut key, argv[1], Effect::Replace(inner)) {
        return fail(ctx, message);
    }
    metrics::record_unlock();
    waiters::key_changed(ctx, argv[1]);
    ffi::reply_integer(ctx, 1)
}

/// A read-only command on the limiter at argv[1] (so it runs on replicas):
/// nil when the key holds no limiter (it is full).
fn read(ctx: Ctx, argv: &[Str], answer: impl FnOnce(&Limiter) -> c_int) -> c_int {
    let Some(mut key) = Key::open(ctx, argv[1], false) else {
        return ffi::reply_null(ctx);
    };
    match key.get::<Limiter>(raw_type()) {
        Slot::Empty => ffi::reply_null(ctx),
        Slot::Foreign => fail(ctx, replication::WRONGTYPE),
        Slot::Ours(limiter) => answer(limiter),
    }
}

/// RL.INSPECT: the limiter's raw state at the server's time, as named
/// fields (see `core::inspect`); nil when the key holds no limiter.
pub fn inspect(ctx: Ctx, argv: &[Str]) -> c_int {
    read(ctx, argv, |limiter| {
        let fields = crate::core::inspect::inspect(limiter, ffi::now());
        let values: Vec<(&std::ffi::CStr, ffi::Value)> = fields
            .iter()
            .map(|(name, field)| {
                let value = match field {
                    Field::Int(n) => ffi::Value::Int(*n),
                    Field::Text(text) => ffi::Value::Bulk(text.as_bytes()),
                    Field::Zone(zone) => ffi::Value::Bulk(zone.as_bytes()),
                    Field::Null => ffi::Value::Null,
                };
                (*name, value)
            })
            .collect();
        ffi::reply_values(ctx, &values)
    })
}

/// `RL.PEEK key`: the limiter's state under its own parameters, read-only
/// (so it runs on replicas). Nil when the key holds no limiter (it is full).
pub fn peek(ctx: Ctx, argv: &[Str]) -> c_int {
    read(ctx, argv, |limiter| reply(ctx, &limiter.peek(ffi::now())))
}
