//! The queues of clients waiting with BLOCK, one per key, and what wakes a
//! queue's first waiter: a timer at its computed time, or a change to the
//! key. Below the command pipeline: its commit tells this file that a key
//! changed (`key_changed`) without knowing what waits on it; blocking.rs,
//! above the pipeline, blocks the clients, tries them and answers them.
//!
//! Waiters of one key are served first come, first served: only the head
//! of a queue may take a permit; the rest stay blocked, untried, until they
//! are first.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use valkey_module::raw;

use super::ffi::{self, Ctx, Str};
use crate::core::{bounds, Millis};

/// (db, key name): a key's queue.
pub type QueueKey = (c_int, Vec<u8>);

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
    static WAITING: Cell<usize> = const { Cell::new(0) };
    /// Inside a reply callback: the server goes on to the key's next waiter
    /// in the same pass, so a grant needs no signal and a leaving head no
    /// wake-up timer (each would cost another pass over every waiter).
    static SERVING: Cell<bool> = const { Cell::new(false) };
    static GENERATION: Cell<u64> = const { Cell::new(0) };
}

/// A context with no client, for timers armed from callbacks that have none
/// (the free callback). Made once at load.
static TIMER_CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(ptr::null_mut());

pub fn init(ctx: Ctx) {
    // SAFETY: called from the module's init with its context.
    let detached = unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx) };
    TIMER_CTX.store(detached, Ordering::Relaxed);
}

/// The context timers are created and stopped with.
pub fn timer_ctx() -> Ctx {
    TIMER_CTX.load(Ordering::Relaxed)
}

/// Whether a waiter is being served (in a reply callback, on its own
/// client's behalf but without its argv).
pub fn serving() -> bool {
    SERVING.get()
}

/// Set around a waiter's attempt in the reply callback (blocking.rs).
pub fn set_serving(serving: bool) {
    SERVING.set(serving);
}

pub fn live_now() -> Millis {
    // SAFETY: a plain read of the server's clock.
    let ms = unsafe { raw::RedisModule_Milliseconds.unwrap()() };
    bounds::clock(Millis(u64::try_from(ms).unwrap_or(0)))
}

fn selected_db(ctx: Ctx) -> c_int {
    // SAFETY: ctx is a live context with a client.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
}

/// The queue of `key` in the context's db.
pub fn queue_of(ctx: Ctx, key: Str) -> QueueKey {
    (selected_db(ctx), ffi::bytes(key).to_vec())
}

/// Whether anyone waits in `queue`.
pub fn others_wait(queue: &QueueKey) -> bool {
    QUEUES.with_borrow(|q| q.get(queue).is_some_and(|q| !q.waiters.is_empty()))
}

/// A blocked client joins the end of `queue`.
pub fn join(queue: &QueueKey, id: u64) {
    QUEUES.with_borrow_mut(|q| q.entry(queue.clone()).or_default().waiters.push_back(id));
    WAITING.set(WAITING.get() + 1);
}

/// The server freed a blocked client (it left its queue before).
pub fn freed() {
    WAITING.set(WAITING.get().saturating_sub(1));
}

pub fn is_first(queue: &QueueKey, id: u64) -> bool {
    QUEUES.with_borrow(|q| {
        q.get(queue)
            .and_then(|q| q.waiters.front())
            .is_some_and(|first| *first == id)
    })
}

/// Takes waiter `id` out of `queue`; when it was first, the next one is
/// tried at once (it may be served now that this one is gone).
pub fn leave(queue: &QueueKey, id: u64) {
    let next_first = QUEUES.with_borrow_mut(|queues| {
        let Some(entry) = queues.get_mut(queue) else {
            return false;
        };
        let was_first = entry.waiters.front() == Some(&id);
        entry.waiters.retain(|other| *other != id);
        if entry.waiters.is_empty() {
            if let Some((timer, _, _)) = entry.timer.take() {
                stop_timer(timer);
            }
            queues.remove(queue);
            return false;
        }
        was_first
    });
    if next_first && !SERVING.get() {
        arm(queue, live_now());
    }
}

/// Whether the key of `queue` had reached, at `now`, the expiry it had
/// when its first waiter last declined.
pub fn expired(queue: &QueueKey, now: Millis) -> bool {
    QUEUES.with_borrow(|q| {
        q.get(queue)
            .and_then(|q| q.key_expiry)
            .is_some_and(|at| now >= at)
    })
}

/// Tells waiters of `key` (in the context's db) that it changed: the first
/// of them is tried again. Cheap when no client waits anywhere.
pub fn key_changed(ctx: Ctx, key: Str) {
    if WAITING.get() == 0 || SERVING.get() {
        return;
    }
    let queue = queue_of(ctx, key);
    if QUEUES.with_borrow(|q| q.contains_key(&queue)) {
        // SAFETY: ctx and key are live for the command.
        unsafe { raw::RedisModule_SignalKeyAsReady.unwrap()(ctx, key) };
    }
}

pub fn note_expiry(queue: &QueueKey, key_expiry: Option<Millis>) {
    QUEUES.with_borrow_mut(|q| {
        if let Some(entry) = q.get_mut(queue) {
            entry.key_expiry = key_expiry;
        }
    });
}

pub fn create_timer(
    delay_ms: u64,
    callback: raw::RedisModuleTimerProc,
    data: *mut c_void,
) -> raw::RedisModuleTimerID {
    // SAFETY: the detached context lives as long as the module.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            timer_ctx(),
            i64::try_from(delay_ms).unwrap_or(i64::MAX),
            callback,
            data,
        )
    }
}

/// What a wake-up timer carries: the queue to signal, and its generation.
struct Wake {
    queue: QueueKey,
    generation: u64,
}

/// Makes sure the first waiter of `queue` is tried at `at` at the latest.
pub fn arm(queue: &QueueKey, at: Millis) {
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
    // SAFETY: the timer was created by `arm` with a boxed Wake; stopping it
    // hands the box back (only when it had not fired).
    unsafe {
        if raw::RedisModule_StopTimer.unwrap()(timer_ctx(), timer, &mut data)
            == raw::Status::Ok as c_int
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
