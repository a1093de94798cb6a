//! The `ratelimit` data type: one limiter per key, any algorithm. Every
//! callback the server makes into it is here; each catches panics and
//! delegates at once to the core's codec.
//!
//! Registration, the top layer (see mod.rs): the type's methods include the
//! stored policies' aux data hooks (stored.rs) and its AOF rewrite emits
//! `rl.apply` (replication.rs), so it sits above both. Files below reach the
//! type through keytype.rs, to which `init` hands the server's handle.

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use valkey_module::native_types::ValkeyType;
use valkey_module::raw;

use super::keytype::{self, ENCODING_VERSION, TYPE_NAME};
use super::{ffi, replication, stored};
use crate::core::codec;
use crate::core::limiter::Limiter;

/// Valkey 9's atomic slot migration asks modules to declare they support it;
/// the crate's flags lack the bit and Valkey 8 ignores it.
const HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;
/// VALKEYMODULE_OPTIONS_SKIP_COMMAND_VALIDATION (Valkey 8.1+).
const SKIP_COMMAND_VALIDATION: c_int = 1 << 4;

pub static RATELIMIT_TYPE: ValkeyType = ValkeyType::new(
    TYPE_NAME,
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        // Stored policies (stored.rs), before the keys.
        aux_load: Some(stored::aux_load),
        aux_save: None,
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: None,
        copy2: None,
        aux_save2: Some(stored::aux_save),
    },
);

/// At load, after the server created the type (valkey_module! creates it
/// before `init`) and before any command exists: hands its handle to
/// keytype.rs and sets the module's options.
pub fn init(ctx: ffi::Ctx) {
    keytype::set_raw_type(*RATELIMIT_TYPE.raw_type.borrow());
    set_module_options(ctx);
}

/// Loading reports I/O errors instead of aborting (needed for diskless
/// loads); keys of this type may be loaded asynchronously or migrated
/// atomically (the type keeps no global state); and modified keys are
/// signalled explicitly, only when they change.
///
/// Where the server offers it (Valkey 8.1+), `RM_Replicate` skips looking
/// up the command it propagates: always our own `rl.apply`, registered at
/// load. That lookup was about half of the cost of propagating an effect.
fn set_module_options(ctx: ffi::Ctx) {
    let mut options = raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS as c_int
        | raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int
        | raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD as c_int
        | HANDLE_ATOMIC_SLOT_MIGRATION;
    // SAFETY: called once from the module's init with its context; the
    // "all options" query exists since the 7.2 API.
    unsafe {
        if let Some(supported) = raw::RedisModule_GetModuleOptionsAll {
            if supported() & SKIP_COMMAND_VALIDATION != 0 {
                options |= SKIP_COMMAND_VALIDATION;
            }
        }
        raw::RedisModule_SetModuleOptions.unwrap()(ctx, options)
    }
}

fn guarded<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}

/// # Safety
/// `value` is a pointer this type handed to the server (a `Box<Limiter>`).
unsafe fn limiter<'a>(value: *mut c_void) -> Option<&'a Limiter> {
    value.cast::<Limiter>().as_ref()
}

fn encoded(limiter: &Limiter) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    codec::encode_limiter(limiter, &mut out);
    out
}

/// # Safety
/// Called by the server with a live RDB handle.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        if encver > ENCODING_VERSION {
            // A newer module wrote this file: refuse rather than misread.
            return std::ptr::null_mut();
        }
        let mut len = 0usize;
        let buffer = raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len);
        if raw::RedisModule_IsIOError.unwrap()(rdb) != 0 || buffer.is_null() {
            return std::ptr::null_mut();
        }
        let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), len);
        // A file (RDB, AOF, a full sync) may hold what an earlier version
        // accepted: repaired rather than refused, since one refused value
        // makes the whole file unloadable. RESTORE is strict.
        let ctx = raw::RedisModule_GetContextFromIO.unwrap()(rdb);
        let loading = raw::RedisModule_GetContextFlags.unwrap()(ctx) as u32
            & raw::REDISMODULE_CTX_FLAGS_LOADING
            != 0;
        let decoded = if loading {
            codec::decode_stored(bytes)
        } else {
            codec::decode_limiter(bytes).map(|limiter| (limiter, false))
        };
        raw::RedisModule_Free.unwrap()(buffer.cast());
        match decoded {
            Some((limiter, repaired)) => {
                if repaired {
                    log_repaired(rdb);
                }
                Box::into_raw(Box::new(limiter)).cast()
            }
            None => std::ptr::null_mut(),
        }
    })
}

/// Says in the server log which key was brought within the bounds.
///
/// # Safety
/// `rdb` is the live handle of the load in progress.
unsafe fn log_repaired(rdb: *mut raw::RedisModuleIO) {
    let name = raw::RedisModule_GetKeyNameFromIO.unwrap()(rdb);
    let (ptr, len) = if name.is_null() {
        (c"?".as_ptr(), 1)
    } else {
        let mut len = 0usize;
        let ptr = raw::RedisModule_StringPtrLen.unwrap()(name, &mut len);
        (ptr, len)
    };
    raw::RedisModule_LogIOError.unwrap()(
        rdb,
        c"warning".as_ptr(),
        c"ratelimit: key '%.*s' held a value no command writes (restored by an earlier version); loaded within the bounds, see docs/stored-values.md".as_ptr(),
        len as std::ffi::c_int,
        ptr,
    );
}

/// # Safety
/// Called by the server with a live RDB handle and one of our values.
unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guarded((), || {
        if let Some(limiter) = limiter(value) {
            let bytes = encoded(limiter);
            raw::RedisModule_SaveStringBuffer.unwrap()(rdb, bytes.as_ptr().cast(), bytes.len());
        }
    })
}

/// The AOF rewrite recreates each key with one RL.APPLY carrying its whole
/// state; the server appends the key's PEXPIREAT after it.
///
/// # Safety
/// Called by the server with a live AOF handle, the key name and our value.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guarded((), || {
        stored::emit_once(aof);
        if let Some(limiter) = limiter(value) {
            let bytes = encoded(limiter);
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                replication::APPLY_COMMAND.as_ptr(),
                c"sb".as_ptr(),
                key,
                bytes.as_ptr(),
                bytes.len(),
            );
        }
    })
}

/// The value's own memory: its allocation (as the allocator sized it) plus a
/// sliding log's buffer. The server's object header and key are not ours.
///
/// # Safety
/// `value` is one of our values.
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    guarded(0, || match limiter(value as *mut c_void) {
        Some(limiter) => ffi::malloc_size(value) + limiter.heap_capacity(),
        None => 0,
    })
}

/// # Safety
/// Called by the server with a live digest handle and one of our values.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guarded((), || {
        if let Some(limiter) = limiter(value) {
            let bytes = encoded(limiter);
            raw::RedisModule_DigestAddStringBuffer.unwrap()(md, bytes.as_ptr().cast(), bytes.len());
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
    })
}

/// # Safety
/// `value` is one of our values, freed exactly once by the server.
unsafe extern "C" fn free(value: *mut c_void) {
    guarded((), || {
        if !value.is_null() {
            drop(Box::from_raw(value.cast::<Limiter>()));
        }
    })
}

/// # Safety
/// `value` is one of our values; the server owns the returned copy.
unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        match limiter(value as *mut c_void) {
            Some(limiter) => Box::into_raw(Box::new(limiter.clone())).cast(),
            None => std::ptr::null_mut(),
        }
    })
}
