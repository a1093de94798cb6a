//! BLOCK: a request denied for now waits for its permit instead, with the
//! blocked-client API (`RM_BlockClientOnKeysWithFlags`). Nothing polls: the
//! first waiter of a key is tried again when its permit is due (a module
//! timer at the computed retry time signals the key ready), when the key
//! changes (a grant, release, refund or unlock by anyone; its deletion), and
//! at its timeout.
//!
//! Waiters of one key are served first come, first served: the module keeps
//! each key's queue, and only its head may take a permit; the rest stay
//! blocked, untried, until they are first. Calls without BLOCK are decided at
//! once as always (they do not queue), so a waiter competes with them only
//! for the moment its permit is due.
//!
//! Nothing is decided or written while a client waits: the effect is
//! committed and propagated when the permit is granted, from the reply
//! callback, exactly as the command would have done. A client that leaves
//! (disconnect, CLIENT KILL, CLIENT UNBLOCK, a role change or slot move that
//! the server answers) has consumed nothing.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use valkey_module::raw;

use super::commands::{self, Attempt, Turn};
use super::ffi::{self, Ctx, Str};
use super::metrics;
use crate::args::Options;
use crate::core::policy::Policy;
use crate::core::{bounds, Millis};

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

/// (db, key name): a key's queue.
type QueueKey = (c_int, Vec<u8>);

#[derive(Default)]
struct Queue {
    waiters: VecDeque<u64>,
    /// The pending wake-up: its timer, when it fires, and its generation
    /// (a timer that fires after being replaced does nothing).
    timer: Option<(raw::RedisModuleTimerID, Millis, u64)>,
    /// The key's expiry when its first waiter last declined: a key gone
    /// after this time expired; one gone before it was deleted or moved.
    key_expiry: Option<Millis>,
}

thread_local! {
    // Commands and callbacks all run on the server's main thread.
    static QUEUES: RefCell<HashMap<QueueKey, Queue>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
    static WAITING: Cell<usize> = const { Cell::new(0) };
    /// Inside a reply callback: the server goes on to the key's next waiter
    /// in the same pass, so a grant needs no signal and a leaving head no
    /// wake-up timer (each would cost another pass over every waiter).
    static SERVING: Cell<bool> = const { Cell::new(false) };
}

/// A context with no client, for timers armed from callbacks that have none
/// (the free callback). Made once at load.
static TIMER_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

/// Whether a waiter is being served (in a reply callback, on its own
/// client's behalf but without its argv).
pub fn serving() -> bool {
    SERVING.get()
}

pub fn init(ctx: Ctx) {
    // SAFETY: called from the module's init with its context.
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx) };
    TIMER_CTX.store(detached, Ordering::Relaxed);
}

fn live_now() -> Millis {
    // SAFETY: a plain read of the server's clock.
    let ms = unsafe { raw::RedisModule_Milliseconds.unwrap()() };
    bounds::clock(Millis(u64::try_from(ms).unwrap_or(0)))
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

fn selected_db(ctx: Ctx) -> c_int {
    // SAFETY: ctx is a live context with a client.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
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
    let queue = (selected_db(ctx), ffi::bytes(key_name).to_vec());
    let others_wait = QUEUES.with_borrow(|q| q.get(&queue).is_some_and(|q| !q.waiters.is_empty()));
    let wake = if others_wait {
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
    QUEUES.with_borrow_mut(|q| q.entry(queue.clone()).or_default().waiters.push_back(id));
    WAITING.set(WAITING.get() + 1);
    metrics::record_block();
    if let Some((at, key_expiry)) = wake {
        note_expiry(&queue, key_expiry);
        arm(&queue, at);
    }
    if let Some(deadline) = deadline {
        // The server checks blocked clients' timeouts before it sleeps, and
        // sleeps until its next timer (serverCron: up to 1000/hz ms). A timer
        // just after the deadline makes the timeout land on time.
        let delay = deadline.saturating_sub(live_now()).0.saturating_add(2);
        let timer = create_timer(delay, Some(on_deadline), waiter_ptr.cast::<c_void>());
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

fn create_timer(
    delay_ms: u64,
    callback: raw::RedisModuleTimerProc,
    data: *mut c_void,
) -> raw::RedisModuleTimerID {
    let ctx = TIMER_CTX.load(Ordering::Relaxed);
    // SAFETY: the detached context lives as long as the module.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            ctx,
            i64::try_from(delay_ms).unwrap_or(i64::MAX),
            callback,
            data,
        )
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
    QUEUES.with_borrow(|q| {
        q.get(&waiter.queue)
            .and_then(|q| q.waiters.front())
            .is_some_and(|id| *id == waiter.id)
    })
}

/// Takes the waiter out of its queue; when it was first, the next one is
/// tried at once (it may be served now that this one is gone).
fn leave(waiter: &mut Waiter) {
    if waiter.done {
        return;
    }
    waiter.done = true;
    let next_first = QUEUES.with_borrow_mut(|queues| {
        let Some(queue) = queues.get_mut(&waiter.queue) else {
            return false;
        };
        let was_first = queue.waiters.front() == Some(&waiter.id);
        queue.waiters.retain(|id| *id != waiter.id);
        if queue.waiters.is_empty() {
            if let Some((timer, _, _)) = queue.timer.take() {
                stop_timer(timer);
            }
            queues.remove(&waiter.queue);
            return false;
        }
        was_first
    });
    if next_first && !SERVING.get() {
        arm(&waiter.queue, live_now());
    }
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
            arm(&waiter.queue, live_now().saturating_add(PAUSED_RETRY));
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
        let expired = QUEUES.with_borrow(|q| {
            q.get(&waiter.queue)
                .and_then(|q| q.key_expiry)
                .is_some_and(|at| now >= at)
        });
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
        SERVING.set(true);
        let attempt = commands::run_policy(ctx, key, waiter.policy, waiter.options, (now, turn));
        let outcome = match attempt {
            Attempt::Done(_) => {
                leave(waiter);
                raw::Status::Ok as c_int
            }
            Attempt::Wait { at, key_expiry } => {
                note_expiry(&waiter.queue, key_expiry);
                arm(&waiter.queue, at);
                raw::Status::Err as c_int
            }
        };
        SERVING.set(false);
        outcome
    }));
    SERVING.set(false);
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
            let ctx = TIMER_CTX.load(Ordering::Relaxed);
            // SAFETY: a deadline timer's data is this waiter, not a Wake
            // box: stop it without taking the data.
            unsafe { raw::RedisModule_StopTimer.unwrap()(ctx, timer, ptr::null_mut()) };
        }
        WAITING.set(WAITING.get().saturating_sub(1));
        metrics::record_unblock(waiter.timed_out);
    }));
}

/// Tells waiters of `key` (in the context's db) that it changed: the first
/// of them is tried again. Cheap when no client waits anywhere.
pub fn key_changed(ctx: Ctx, key: Str) {
    if WAITING.get() == 0 || SERVING.get() {
        return;
    }
    let queue = (selected_db(ctx), ffi::bytes(key).to_vec());
    if QUEUES.with_borrow(|q| q.contains_key(&queue)) {
        // SAFETY: ctx and key are live for the command.
        unsafe { raw::RedisModule_SignalKeyAsReady.unwrap()(ctx, key) };
    }
}

fn note_expiry(queue: &QueueKey, key_expiry: Option<Millis>) {
    QUEUES.with_borrow_mut(|q| {
        if let Some(entry) = q.get_mut(queue) {
            entry.key_expiry = key_expiry;
        }
    });
}

/// What a wake-up timer carries: the queue to signal, and its generation.
struct Wake {
    queue: QueueKey,
    generation: u64,
}

thread_local! {
    static GENERATION: Cell<u64> = const { Cell::new(0) };
}

/// Makes sure the first waiter of `queue` is tried at `at` at the latest.
fn arm(queue: &QueueKey, at: Millis) {
    QUEUES.with_borrow_mut(|queues| {
        let Some(entry) = queues.get_mut(queue) else {
            return;
        };
        if let Some((timer, when, _)) = entry.timer {
            if when <= at {
                return;
            }
            stop_timer(timer);
            entry.timer = None;
        }
        let generation = GENERATION.replace(GENERATION.get() + 1);
        let wake = Box::new(Wake {
            queue: queue.clone(),
            generation,
        });
        // The box comes back in `on_wake` or `stop_timer`, exactly once.
        let data = Box::into_raw(wake).cast::<c_void>();
        let timer = create_timer(at.saturating_sub(live_now()).0, Some(on_wake), data);
        entry.timer = Some((timer, at, generation));
    });
}

fn stop_timer(timer: raw::RedisModuleTimerID) {
    let mut data: *mut c_void = ptr::null_mut();
    let ctx = TIMER_CTX.load(Ordering::Relaxed);
    // SAFETY: the timer was created by `arm` with a boxed Wake; stopping it
    // hands the box back (only when it had not fired).
    unsafe {
        if raw::RedisModule_StopTimer.unwrap()(ctx, timer, &mut data) == raw::Status::Ok as c_int
            && !data.is_null()
        {
            drop(Box::from_raw(data.cast::<Wake>()));
        }
    }
}

/// A wake-up is due: signal the key ready, so the server tries its waiters.
unsafe extern "C" fn on_wake(ctx: Ctx, data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `arm` made this box; the server hands it back once.
        let wake = unsafe { Box::from_raw(data.cast::<Wake>()) };
        let current = QUEUES.with_borrow_mut(|queues| match queues.get_mut(&wake.queue) {
            Some(entry) if entry.timer.is_some_and(|(_, _, g)| g == wake.generation) => {
                entry.timer = None;
                true
            }
            _ => false,
        });
        if !current {
            return;
        }
        let (db, name) = &wake.queue;
        // SAFETY: the timer's context is live during the callback; the
        // string is freed below.
        unsafe {
            raw::RedisModule_SelectDb.unwrap()(ctx, *db);
            let key = raw::RedisModule_CreateString.unwrap()(ctx, name.as_ptr().cast(), name.len());
            raw::RedisModule_SignalKeyAsReady.unwrap()(ctx, key);
            raw::RedisModule_FreeString.unwrap()(ctx, key);
        }
    }));
}
