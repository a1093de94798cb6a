//! Whether a change must be queued as an `RL.APPLY` effect, or whether
//! nothing can ever read it and the server would drop it anyway.
//!
//! The server drops a propagated command unless the AOF is on or a
//! replication backlog or replica exists (`shouldPropagate` in server.c),
//! but only after the module has built the command (about 1,300 to 2,700
//! instructions, a third of a call). While none of those can exist, we skip
//! building it and call `ReplicateVerbatim` instead (49 instructions), which
//! the server drops just the same but which still counts the change for the
//! `save` points (`rdb_changes_since_last_save`).
//!
//! The switch is one-way. It starts off only on a standalone primary with
//! no AOF, no backlog and no fork child, and turns on for good at the first
//! sign that something may consume the stream: a fork (a full sync's RDB or
//! an AOF rewrite holds every earlier change; the ones after it must flow),
//! a replica or role change, the AOF switched on, a backlog after loading.
//! A replica attaching needs a fork (no backlog means no partial resync),
//! so no change made before the switch turns on can be missed by anyone.
//! `ratelimit.always-propagate yes` keeps it on from the start.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use valkey_module::raw;

use super::ffi::Ctx;

/// `ratelimit.always-propagate yes|no`: never skip building the effect.
pub static ALWAYS: AtomicBool = AtomicBool::new(false);

const ON: u8 = 0;
const OFF: u8 = 1;
/// Off until the first change after a load is made: the server decides to
/// keep or drop its backlog only after the loading-ended event.
const RECHECK: u8 = 2;

/// Whether effects are built and queued. Starts on: a load that cannot
/// prove the skip safe leaves it on.
static STATE: AtomicU8 = AtomicU8::new(ON);

/// Whether this change's effect must be built and queued, or only counted.
/// Off, the context flags (about 120 instructions) are read on every call as
/// a second guard: an AOF, a replica role or cluster mode turns it on.
pub fn needed(ctx: Ctx) -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => return true,
        OFF => {}
        _ if nothing_can_consume(ctx) => STATE.store(OFF, Ordering::Relaxed),
        _ => {
            turn_on();
            return true;
        }
    }
    // SAFETY: ctx is a live command context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32;
    let consumers = raw::REDISMODULE_CTX_FLAGS_AOF
        | raw::REDISMODULE_CTX_FLAGS_SLAVE
        | raw::REDISMODULE_CTX_FLAGS_CLUSTER
        | raw::REDISMODULE_CTX_FLAGS_REPLICATED;
    if flags & consumers != 0 || ALWAYS.load(Ordering::Relaxed) {
        turn_on();
        return true;
    }
    false
}

/// For INFO: whether the next change's effect is built (until a recheck
/// proves otherwise, it is).
pub fn is_on() -> bool {
    STATE.load(Ordering::Relaxed) != OFF
}

fn turn_on() {
    STATE.store(ON, Ordering::Relaxed);
}

/// At load (after the events are subscribed, events.rs): start with the
/// switch off if nothing can consume the stream now.
pub fn init(ctx: Ctx) {
    if !ALWAYS.load(Ordering::Relaxed) && nothing_can_consume(ctx) {
        STATE.store(OFF, Ordering::Relaxed);
    }
}

/// A server event (events.rs lists which).
pub fn on_event(ctx: Ctx, id: u64, subevent: u64) {
    if STATE.load(Ordering::Relaxed) == ON {
        return;
    }
    match id {
        // A primary restarted from an RDB with a replication id keeps the
        // backlog it made for loading, for partial resyncs of its old
        // replicas; without one it drops it, but only after this event.
        raw::REDISMODULE_EVENT_LOADING => {
            if subevent == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
                STATE.store(RECHECK, Ordering::Relaxed);
            }
        }
        raw::REDISMODULE_EVENT_FORK_CHILD => {
            if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
                turn_on();
            }
        }
        // Any config change may be `appendonly yes` or this module's own
        // switch; both are read again, a change of anything else costs one
        // INFO read.
        raw::REDISMODULE_EVENT_CONFIG => {
            if ALWAYS.load(Ordering::Relaxed) || !nothing_can_consume(ctx) {
                turn_on();
            }
        }
        _ => turn_on(),
    }
}

/// A standalone primary without AOF, backlog, replicas or a fork child.
fn nothing_can_consume(ctx: Ctx) -> bool {
    let checks: [(&CStr, &[(&CStr, &str)]); 3] = [
        (
            c"replication",
            &[
                (c"role", "master"),
                (c"connected_slaves", "0"),
                (c"repl_backlog_active", "0"),
            ],
        ),
        (
            c"persistence",
            &[
                (c"aof_enabled", "0"),
                (c"rdb_bgsave_in_progress", "0"),
                (c"aof_rewrite_in_progress", "0"),
                (c"module_fork_in_progress", "0"),
            ],
        ),
        (c"cluster", &[(c"cluster_enabled", "0")]),
    ];
    checks
        .iter()
        .all(|(section, fields)| info_fields_are(ctx, section, fields))
}

/// Whether each field of one INFO section (read once) has its value; a
/// missing field is not.
fn info_fields_are(ctx: Ctx, section: &CStr, fields: &[(&CStr, &str)]) -> bool {
    // SAFETY: ctx is live; the info data is freed before returning, and each
    // field's C string is compared before that.
    unsafe {
        let data = raw::RedisModule_GetServerInfo.unwrap()(ctx, section.as_ptr());
        if data.is_null() {
            return false;
        }
        let all = fields.iter().all(|(field, want)| {
            let value = raw::RedisModule_ServerInfoGetFieldC.unwrap()(data, field.as_ptr());
            !value.is_null() && CStr::from_ptr(value).to_bytes() == want.as_bytes()
        });
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, data);
        all
    }
}
