//! Operators' controls: the module configs (`CONFIG SET ratelimit.*`,
//! persisted by `CONFIG REWRITE`), keyspace events on denials and lockouts,
//! and shadow mode. The configs are registered by `valkey_module!` in lib.rs;
//! commands read them here, on the main thread.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use super::denied_report;
use super::ffi::{self, Ctx, Str};
use super::metrics;
use crate::args;

/// `ratelimit.events yes|no`: emit keyspace events (class `d`, module).
pub static EVENTS: AtomicBool = AtomicBool::new(false);
/// `ratelimit.shadow-mode yes|no`: decide and count as usual, answer allowed.
pub static SHADOW: AtomicBool = AtomicBool::new(false);
/// `ratelimit.max-limiters n`: the most limiters one RL.ALL call takes.
pub static MAX_LIMITERS: AtomicI64 = AtomicI64::new(args::DEFAULT_MAX_LIMITERS as i64);
pub const MAX_LIMITERS_BOUND: i64 = 1024;

/// A request the limiter denied.
pub const DENIED_EVENT: &CStr = c"ratelimit.denied";
/// A request the limiter would have denied, answered allowed (shadow mode).
pub const SHADOW_DENIED_EVENT: &CStr = c"ratelimit.shadow-denied";
/// A denied request locked its key (LOCKOUT).
pub const LOCKED_EVENT: &CStr = c"ratelimit.locked";

pub fn max_limiters() -> usize {
    MAX_LIMITERS
        .load(Ordering::Relaxed)
        .clamp(1, MAX_LIMITERS_BOUND) as usize
}

/// Whether denials are answered as allowed.
pub fn shadow() -> bool {
    SHADOW.load(Ordering::Relaxed)
}

/// A request on `key` was denied by its limiter (`dry_run`: only asked).
/// Counts it and emits the event; the caller answers it allowed when
/// `shadow` is on. A dry run is a question, not traffic: no event, not counted.
pub fn on_denied(ctx: Ctx, key: Str, dry_run: bool) {
    if dry_run {
        return;
    }
    let shadow = shadow();
    if shadow {
        metrics::record_shadow_denied();
    }
    denied_report::record(key);
    if EVENTS.load(Ordering::Relaxed) {
        let event = if shadow {
            SHADOW_DENIED_EVENT
        } else {
            DENIED_EVENT
        };
        ffi::notify(ctx, event, key);
    }
}

/// A denied request locked `key` out (LOCKOUT).
pub fn on_locked(ctx: Ctx, key: Str) {
    metrics::record_lockout();
    if EVENTS.load(Ordering::Relaxed) {
        ffi::notify(ctx, LOCKED_EVENT, key);
    }
}
