//! Replication and the AOF carry effects, not decisions. A command that
//! changes a limiter queues one `RL.APPLY key <effect>`: the new state of a
//! token bucket or window (about 50 bytes), or one logged request of a
//! sliding log (34 bytes, however long the log). Applying it reads no clock
//! and decides nothing, so replicas and AOF replay reach exactly the
//! primary's state. Requests that change nothing propagate nothing.

use std::ffi::{c_int, CStr};

use super::ffi::{self, Ctx, Key, Slot, Str};
use super::keytype::raw_type;
use super::{propagation, waiters};
use crate::core::codec;
use crate::core::limiter::{ApplyError, Effect, Limiter};
use crate::core::policy::PerLimiter;

/// Internal: flagged admin, so only users granted @admin (or the replication
/// link and AOF loading, which run unchecked) may call it.
pub const APPLY_COMMAND: &CStr = c"rl.apply";

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn apply_error(error: ApplyError) -> &'static str {
    match error {
        ApplyError::WrongType => WRONGTYPE,
        ApplyError::Refused => {
            "ERR RL.APPLY payload would make a state no command makes (a lease grant beyond the limit)"
        }
    }
}

/// Applies an effect to an open key and sets the key's expiry. Err carries
/// the error reply when the key holds something the effect cannot apply to.
pub fn apply(key: &mut Key, effect: Effect) -> Result<(), &'static str> {
    let ty = raw_type();
    // A log or lease effect made at a time when this copy's limiter had
    // already expired was made on a primary that no longer had the key: start
    // from empty as it did. Copies can hold such a key when the primary
    // dropped it without a DEL (a primary loading an RDB skips expired keys;
    // replicas never expire keys themselves).
    let made_at = match &effect {
        Effect::LogRecord(record) => Some(record.at),
        Effect::LogRefund { at, .. } => Some(*at),
        Effect::Lease(change) => Some(change.at()),
        Effect::Replace(_) => None,
    };
    let stale = made_at.is_some_and(|at| key.expired_by(at));
    let slot = match key.get::<Limiter>(ty) {
        Slot::Ours(_) if stale => Slot::Empty,
        slot => slot,
    };
    let expires_at = match slot {
        Slot::Foreign => return Err(WRONGTYPE),
        Slot::Ours(current) => {
            current.apply(effect).map_err(apply_error)?;
            current.expires_at()
        }
        Slot::Empty => {
            // Nothing to give back to or keep on a limiter that is not
            // there (it is full).
            let Some(limiter) = Limiter::from_effect(effect).map_err(apply_error)? else {
                return Ok(());
            };
            let at = limiter.expires_at();
            if !key.set(ty, Box::new(limiter)) {
                return Err("ERR could not store the limiter");
            }
            at
        }
    };
    key.expire_at(expires_at);
    Ok(())
}

thread_local! {
    static EFFECT_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Applies the effect of a command to its key and queues it for replicas
/// and the AOF; where nothing can read them (propagation.rs) it only counts
/// the change, by queueing the client's own command, which the server drops.
pub fn commit(ctx: Ctx, key: &mut Key, key_name: Str, effect: Effect) -> Result<(), &'static str> {
    commit_all(ctx, std::iter::once((key, key_name, effect)))
}

/// Commits the effects of one call (one key, or each key RL.ALL changed),
/// queued as `RL.APPLY key effect [key effect ...]` entries of up to four
/// pairs: one propagation for a typical call instead of one per key. On an
/// error, what was applied before it is still queued, so copies never miss a
/// change the primary made.
pub fn commit_all<'k>(
    ctx: Ctx,
    mut changes: impl Iterator<Item = (&'k mut Key, Str, Effect)>,
) -> Result<(), &'static str> {
    // A change granted to a waiter is made in a reply callback, whose client
    // has no argv to pass on verbatim: it always builds the effect.
    let build = propagation::needed(ctx) || waiters::serving();
    // Each effect is encoded before it is applied (applying consumes it), one
    // after another into a buffer reused across calls (no allocation); a
    // batch remembers each one's key and where it ends.
    EFFECT_BUFFER.with_borrow_mut(|blob| {
        let mut batch: [(Str, usize); PAIRS_PER_ENTRY] =
            [(std::ptr::null_mut(), 0); PAIRS_PER_ENTRY];
        let mut queued = 0;
        let mut outcome = Ok(());
        blob.clear();
        // By reference: moving the iterator in would copy what it holds.
        for (key, key_name, effect) in &mut changes {
            if build {
                codec::encode_effect(&effect, blob);
            }
            if let Err(message) = apply(key, effect) {
                outcome = Err(message);
                break;
            }
            ffi::signal_modified(ctx, key_name);
            // Waiters of this key try again: the change may have freed their permit.
            waiters::key_changed(ctx, key_name);
            batch[queued] = (key_name, blob.len());
            queued += 1;
            if queued == PAIRS_PER_ENTRY {
                propagate_batch(ctx, build, &batch, blob);
                queued = 0;
                blob.clear();
            }
        }
        if queued > 0 {
            propagate_batch(ctx, build, &batch[..queued], blob);
        }
        outcome
    })
}

/// The most pairs one queued RL.APPLY carries (`ffi::replicate_pairs`).
const PAIRS_PER_ENTRY: usize = 4;

/// Queues one RL.APPLY for `batch` (keys and where their effect ends in
/// `blob`), or, where nothing reads effects, counts the change.
fn propagate_batch(ctx: Ctx, build: bool, batch: &[(Str, usize)], blob: &[u8]) {
    if !build {
        ffi::replicate_verbatim(ctx);
        return;
    }
    let mut pairs: [(Str, &[u8]); PAIRS_PER_ENTRY] = [(std::ptr::null_mut(), &[]); PAIRS_PER_ENTRY];
    let mut start = 0;
    for (pair, &(key, end)) in pairs.iter_mut().zip(batch) {
        *pair = (key, &blob[start..end]);
        start = end;
    }
    // The server only refuses an unknown command or format, which would be a
    // bug here, so say so loudly in the log; the client still gets its reply.
    if ffi::replicate_pairs(ctx, APPLY_COMMAND, &pairs[..batch.len()]) != Some(true) {
        ffi::log_warning(ctx, c"ratelimit: the server refused to propagate rl.apply; replicas and the AOF miss a change");
    }
}

/// `RL.APPLY key effect [key effect ...]`: what replicas and the AOF
/// execute. Deterministic, so it is passed on verbatim (to sub-replicas and
/// this node's AOF). Every payload is decoded before anything is applied,
/// so a bad one writes nothing.
pub fn apply_command(ctx: Ctx, argv: &[Str]) -> c_int {
    let mut effects: PerLimiter<Effect> = PerLimiter::new();
    for pair in argv[1..].chunks_exact(2) {
        let Some(effect) = codec::decode_effect(ffi::bytes(pair[1])) else {
            return ffi::reply_error(
                ctx,
                "ERR RL.APPLY payload is invalid or from a newer version",
            );
        };
        effects.push(effect);
    }
    for (pair, effect) in argv[1..].chunks_exact(2).zip(effects) {
        let Some(mut key) = Key::open(ctx, pair[0], true) else {
            return ffi::reply_error(ctx, "ERR could not open the key for writing");
        };
        if let Err(message) = apply(&mut key, effect) {
            return ffi::reply_error(ctx, message);
        }
        ffi::signal_modified(ctx, pair[0]);
    }
    ffi::replicate_verbatim(ctx);
    ffi::reply_ok(ctx)
}
