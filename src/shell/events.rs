//! Server events, subscribed once at load (a module has one callback per
//! event) and handed to the concerns that need them.

use std::ffi::{c_int, c_void};

use valkey_module::raw;

use super::ffi::Ctx;
use super::{propagation, stored};

/// Subscribes to every event; false when the server refused one (the
/// propagation switch then stays on: a path it cannot hear it cannot guard).
pub fn init(ctx: Ctx) -> bool {
    let events = [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_CONFIG,
    ];
    events.into_iter().all(|id| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: ctx is the load context; the callback is a plain function.
        let status =
            unsafe { raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx, event, Some(on_event)) };
        status == raw::Status::Ok as c_int
    })
}

unsafe extern "C" fn on_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        if event.id == raw::REDISMODULE_EVENT_LOADING {
            stored::on_loading(subevent);
        }
        propagation::on_event(ctx, event.id, subevent);
    });
}
