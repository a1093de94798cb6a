//! BLOCK: a request denied for now waits for its permit instead, with the
//! blocked-client API (`RM_BlockClientOnKeysWithFlags`). Nothing polls: the
//! first waiter of a key is tried again when its permit is due (a module
//! timer at the computed retry time signals the key ready), when the key
//! changes (a grant, release, refund or unlock by anyone; its deletion), and
//! at its timeout.
//!
//! Waiters of one key are served first come, first served, in the key's
//! queue (waiters.rs, below the pipeline, so that a commit can signal it).
//! Calls without BLOCK are decided at once as always (they do not queue), so
//! a waiter competes with them only for the moment its permit is due.
//!
//! Nothing is decided or written while a client waits: the effect is
//! committed and propagated when the permit is granted, from the reply
//! callback, exactly as the command would have done. A client that leaves
//! (disconnect, CLIENT KILL, CLIENT UNBLOCK, a role change or slot move that
//! the server answers) has consumed nothing.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ptr;

use valkey_module::raw;

use super::commands::{self, Attempt, Turn};
use super::ffi::{self, Ctx, Str};
use super::metrics;
use super::waiters::{self, live_now, QueueKey};
use crate::args::Options;
use crate::core::policy::Policy;
use crate::core::Millis;

/// One waiting client: what it asked, on which key, until when.
struct Waiter {
    id: u64,
    queue: QueueKey,
    policy: Policy,
    options: Options,
    deadline: Option<Millis>,
    /// Set once it is answered or its time ran out: it has left the queue.
    done: bool,
    timed_out: bool,
    /// Wakes the event loop just after the deadline (see `start`).
    deadline_timer: Option<raw::RedisModuleTimerID>,
}

thread_local! {
    // Commands and callbacks all run on the server's main thread.
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
}

/// How often a waiter is tried while writes are paused.
const PAUSED_RETRY: Millis = Millis(10);

fn avoid_replica_traffic() -> bool {
    // SAFETY: a plain query of the server's pause state.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() != 0 }
}

/// Whether this call may block its client: not inside MULTI/EXEC or a
/// script, not replicated or loaded from the AOF, and not where the server
/// forbids it (e.g. a command called from a module).
fn can_block(ctx: Ctx) -> bool {
    const NO_BLOCKING: u32 = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
        | raw::REDISMODULE_CTX_FLAGS_REPLICATED
        | raw::REDISMODULE_CTX_FLAGS_LOADING;
    // SAFETY: ctx is the live command context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    flags & NO_BLOCKING == 0
}

/// A command with BLOCK `timeout` (0: none): decided at once unless it
/// would be denied now and a wait could grant it, or others wait already.
pub fn start(ctx: Ctx, key_name: Str, policy: Policy, options: Options, timeout: Millis) -> c_int {
    let now = ffi::now();
    // Inside MULTI/EXEC or a script nothing can wait; a peek (COST 0) asks
    // for nothing, so it never waits either, nor queues behind waiters.
    if !can_block(ctx) || options.cost == 0 {
        return commands::run_policy(ctx, key_name, policy, options, (now, Turn::Final)).done();
    }
    let deadline = (timeout > Millis::ZERO).then(|| now.saturating_add(timeout));
    let queue = waiters::queue_of(ctx, key_name);
    let wake = if waiters::others_wait(&queue) {
        // First come, first served: behind them, untried.
        None
    } else {
        let when = (now, Turn::MayWait { deadline });
        match commands::run_policy(ctx, key_name, policy, options, when) {
            Attempt::Done(status) => return status,
            Attempt::Wait { at, key_expiry } => Some((at, key_expiry)),
        }
    };
    let id = NEXT_ID.replace(NEXT_ID.get() + 1);
    let waiter = Box::new(Waiter {
        id,
        queue: queue.clone(),
        policy,
        options,
        deadline,
        done: false,
        timed_out: false,
        deadline_timer: None,
    });
    let waiter_ptr = Box::into_raw(waiter);
    let mut keys = [key_name];
    // SAFETY: ctx is the live command context; the server keeps its own
    // reference to the key name; the waiter box is handed to the server and
    // comes back in free_waiter, exactly once.
    let blocked = unsafe {
        raw::RedisModule_BlockClientOnKeysWithFlags.unwrap()(
            ctx,
            Some(on_ready),
            Some(on_timeout),
            Some(free_waiter),
            timeout.to_i64_saturating(),
            keys.as_mut_ptr(),
            1,
            waiter_ptr.cast::<c_void>(),
            raw::REDISMODULE_BLOCK_UNBLOCK_DELETED as c_int,
        )
    };
    if blocked.is_null() {
        // Valkey 9 refuses clients that are not plain connections (and
        // never takes the private data then). Answer at once.
        // SAFETY: the server did not take the box.
        drop(unsafe { Box::from_raw(waiter_ptr) });
        return commands::run_policy(ctx, key_name, policy, options, (now, Turn::Final)).done();
    }
    waiters::join(&queue, id);
    metrics::record_block();
    if let Some((at, key_expiry)) = wake {
        waiters::note_expiry(&queue, key_expiry);
        waiters::arm(&queue, at);
    }
    if let Some(deadline) = deadline {
        // The server checks blocked clients' timeouts before it sleeps, and
        // sleeps until its next timer (serverCron: up to 1000/hz ms). A timer
        // just after the deadline makes the timeout land on time.
        let delay = deadline.saturating_sub(live_now()).0.saturating_add(2);
        let timer = waiters::create_timer(delay, Some(on_deadline), waiter_ptr.cast::<c_void>());
        // SAFETY: the server owns the waiter until free_waiter, which runs
        // on this thread after this command returns.
        unsafe { (*waiter_ptr).deadline_timer = Some(timer) };
    }
    raw::Status::Ok as c_int
}

/// Firing is the point: the event loop wakes, and the server answers the
/// timed-out client before it sleeps again. The waiter forgets the timer:
/// a fired timer's id may be given to a new timer, which must not be stopped.
unsafe extern "C" fn on_deadline(_ctx: Ctx, data: *mut c_void) {
    // SAFETY: `data` is the waiter this timer was made for; free_waiter
    // stops the timer before it frees the waiter, so it is live here.
    if let Some(waiter) = unsafe { data.cast::<Waiter>().as_mut() } {
        waiter.deadline_timer = None;
    }
}

/// The waiter of a blocked-client callback.
///
/// # Safety
/// `ctx` is a reply or timeout callback's context of a client blocked by
/// `start`, whose private data is a live `Waiter`.
unsafe fn waiter_of<'a>(ctx: Ctx) -> Option<&'a mut Waiter> {
    raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
        .cast::<Waiter>()
        .as_mut()
}

fn is_first(waiter: &Waiter) -> bool {
    waiters::is_first(&waiter.queue, waiter.id)
}

/// Takes the waiter out of its queue, once.
fn leave(waiter: &mut Waiter) {
    if waiter.done {
        return;
    }
    waiter.done = true;
    waiters::leave(&waiter.queue, waiter.id);
}

/// The server tries a waiter: its key was signalled ready (our timer, a
/// change, a deletion). REDISMODULE_OK when answered, ERR to keep waiting.
unsafe extern "C" fn on_ready(ctx: Ctx, _argv: *mut Str, _argc: c_int) -> c_int {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the server calls this for a client `start` blocked.
        let Some(waiter) = (unsafe { waiter_of(ctx) }) else {
            return raw::Status::Err as c_int;
        };
        if waiter.done || !is_first(waiter) {
            return raw::Status::Err as c_int;
        }
        // During CLIENT PAUSE WRITE (and a failover's pause) nothing may be
        // propagated: a grant here would crash the server. Try again soon.
        if avoid_replica_traffic() {
            waiters::arm(&waiter.queue, live_now().saturating_add(PAUSED_RETRY));
            return raw::Status::Err as c_int;
        }
        // SAFETY: within a reply callback the ready key is live.
        let key = unsafe { raw::RedisModule_GetBlockedClientReadyKey.unwrap()(ctx) };
        if key.is_null() {
            return raw::Status::Err as c_int;
        }
        // In a cluster a key that vanished before its expiry may have been
        // migrated away (the server retries waiters of a deleted key without
        // checking the slot is still ours): the client sends the call again
        // and is routed to wherever the key lives now. Cluster clients retry
        // TRYAGAIN. A key that reached its expiry is simply full again.
        let now = live_now();
        let expired = waiters::expired(&waiter.queue, now);
        if ffi::is_cluster(ctx) && !expired && !ffi::key_exists(ctx, key) {
            ffi::reply_error(
                ctx,
                "TRYAGAIN the key of this waiting call is gone (deleted or migrated): call again",
            );
            leave(waiter);
            return raw::Status::Ok as c_int;
        }
        let turn = match waiter.deadline {
            Some(deadline) if now >= deadline => {
                waiter.timed_out = true;
                Turn::Final
            }
            deadline => Turn::MayWait { deadline },
        };
        waiters::set_serving(true);
        let attempt = commands::run_policy(ctx, key, waiter.policy, waiter.options, (now, turn));
        let outcome = match attempt {
            Attempt::Done(_) => {
                leave(waiter);
                raw::Status::Ok as c_int
            }
            Attempt::Wait { at, key_expiry } => {
                waiters::note_expiry(&waiter.queue, key_expiry);
                waiters::arm(&waiter.queue, at);
                raw::Status::Err as c_int
            }
        };
        waiters::set_serving(false);
        outcome
    }));
    waiters::set_serving(false);
    outcome.unwrap_or_else(|_| {
        ffi::reply_error(
            ctx,
            "ERR internal error in the ratelimit module (please report it)",
        );
        raw::Status::Ok as c_int
    })
}

/// The waiter's BLOCK timeout passed (or CLIENT UNBLOCK ... TIMEOUT): it is
/// answered as the request stands now, never ahead of an earlier waiter.
unsafe extern "C" fn on_timeout(ctx: Ctx, _argv: *mut Str, _argc: c_int) -> c_int {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the server calls this for a client `start` blocked.
        let Some(waiter) = (unsafe { waiter_of(ctx) }) else {
            return ffi::reply_error(ctx, "ERR the wait ended");
        };
        waiter.timed_out = true;
        let first = is_first(waiter);
        leave(waiter);
        let name = &waiter.queue.1;
        // SAFETY: ctx is live; the string is freed below.
        let key = unsafe {
            raw::RedisModule_CreateString.unwrap()(ctx, name.as_ptr().cast(), name.len())
        };
        let now = live_now();
        // Paused writes (see on_ready): answer without taking anything.
        let first = first && !avoid_replica_traffic();
        let status = if first {
            commands::run_policy(ctx, key, waiter.policy, waiter.options, (now, Turn::Final)).done()
        } else {
            // Earlier waiters come first: denied, whatever is free now.
            commands::run_policy(ctx, key, waiter.policy, waiter.options, (now, Turn::Behind))
                .done()
        };
        // SAFETY: created above, not used after.
        unsafe { raw::RedisModule_FreeString.unwrap()(ctx, key) };
        status
    }));
    outcome.unwrap_or_else(|_| {
        ffi::reply_error(
            ctx,
            "ERR internal error in the ratelimit module (please report it)",
        )
    })
}

/// The server is done with the blocked client: answered, timed out, or gone.
unsafe extern "C" fn free_waiter(_ctx: Ctx, privdata: *mut c_void) {
    if privdata.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `start` handed this box to the server, which frees it once.
        let mut waiter = unsafe { Box::from_raw(privdata.cast::<Waiter>()) };
        leave(&mut waiter);
        if let Some(timer) = waiter.deadline_timer {
            // SAFETY: a deadline timer's data is this waiter, not a wake-up
            // box: stop it without taking the data.
            unsafe {
                raw::RedisModule_StopTimer.unwrap()(waiters::timer_ctx(), timer, ptr::null_mut())
            };
        }
        waiters::freed();
        metrics::record_unblock(waiter.timed_out);
    }));
}
