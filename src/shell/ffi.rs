//! The few raw Valkey module API calls this module makes, each wrapped once
//! in a safe function. Every `unsafe` block relies on the server having
//! filled the API table at load time (the crate's init does) and on being
//! called from the server's main thread inside a command or callback.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;

use valkey_module::raw;

use crate::core::{bounds, Millis};

pub type Ctx = *mut raw::RedisModuleCtx;
pub type Str = *mut raw::RedisModuleString;

/// The bytes of a server string, borrowed for as long as the command runs.
pub fn bytes<'a>(s: Str) -> &'a [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is a live RedisModuleString owned by the server for the
    // duration of the call; StringPtrLen returns a pointer into it.
    unsafe {
        let ptr = raw::RedisModule_StringPtrLen.unwrap()(s, &mut len);
        if ptr.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(ptr.cast::<u8>(), len)
    }
}

/// The command's arguments as the server passed them.
pub struct Argv<'a>(pub &'a [Str]);

impl crate::args::Args for Argv<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> &[u8] {
        bytes(self.0[index])
    }
}

/// The per-command cached clock: the same for every command of one
/// MULTI/EXEC or script, and never a client's clock; never later than the
/// latest time a state may hold (`bounds::clock`).
pub fn now() -> Millis {
    // SAFETY: a plain read of the server's cached time.
    let micros = unsafe { raw::RedisModule_CachedMicroseconds.unwrap()() };
    bounds::clock(Millis(u64::try_from(micros).unwrap_or(0) / 1000))
}

/// The context's flags, for a caller that asks more than one question of
/// them (each `GetContextFlags` computes them all).
#[derive(Clone, Copy)]
pub struct ContextFlags(u32);

impl ContextFlags {
    pub fn resp3(self) -> bool {
        self.0 & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0
    }
    pub fn cluster(self) -> bool {
        self.0 & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
    }
}

pub fn context_flags(ctx: Ctx) -> ContextFlags {
    // SAFETY: ctx is the live command context.
    ContextFlags(unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) } as u32)
}

pub fn is_resp3(ctx: Ctx) -> bool {
    // SAFETY: ctx is the live command context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) };
    (flags as u32) & raw::REDISMODULE_CTX_FLAGS_RESP3 != 0
}

/// Whether the server is asking a `getkeys-api` command for its keys.
pub fn is_keys_position_request(ctx: Ctx) -> bool {
    // SAFETY: ctx is the live command context.
    unsafe { raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx) != 0 }
}

/// Key spec flags of a key read, modified and revealed by the reply: the
/// limiters' keys (command registration, and the keys position request).
pub const KEY_UPDATE: u32 =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;

/// Answers a keys position request: argument `position` is a key, of
/// `KEY_UPDATE` as the key spec declares it (KeyAtPos would claim full
/// access, and convert its flags twice).
pub fn key_at_pos(ctx: Ctx, position: usize) {
    // SAFETY: ctx is a keys position request context.
    unsafe {
        raw::RedisModule_KeyAtPosWithFlags.unwrap()(ctx, position as c_int, KEY_UPDATE as c_int)
    }
}

pub fn is_cluster(ctx: Ctx) -> bool {
    // SAFETY: ctx is the live command context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx) };
    (flags as u32) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
}

pub fn reply_error(ctx: Ctx, message: &str) -> c_int {
    let text = std::ffi::CString::new(message.replace('\0', "?"))
        .unwrap_or_else(|_| c"ERR internal error".to_owned());
    // SAFETY: ctx is live; the message is NUL-terminated and copied by the server.
    unsafe { raw::RedisModule_ReplyWithError.unwrap()(ctx, text.as_ptr()) }
}

/// What a command returns when it has nothing to reply (a keys position
/// request: the server reads the keys reported, never a reply).
pub const NO_REPLY: c_int = raw::Status::Ok as c_int;

pub fn reply_ok(ctx: Ctx) -> c_int {
    // SAFETY: ctx is live; the string is static.
    unsafe { raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, c"OK".as_ptr()) }
}

pub fn reply_integer(ctx: Ctx, value: i64) -> c_int {
    // SAFETY: ctx is the live command context.
    unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, value) }
}

pub fn reply_null(ctx: Ctx) -> c_int {
    // SAFETY: ctx is the live command context.
    unsafe { raw::RedisModule_ReplyWithNull.unwrap()(ctx) }
}

/// Replies with named integers: a map under RESP3, an array of the values
/// (in order) under RESP2.
pub fn reply_fields(ctx: Ctx, fields: &[(&CStr, i64)]) -> c_int {
    reply_named(ctx, fields, |n| {
        // SAFETY: ctx is the live command context.
        unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *n) };
    })
}

/// A reply value of a mixed reply.
pub enum Value<'a> {
    Int(i64),
    Bulk(&'a [u8]),
    Null,
}

/// Replies with named values: a map under RESP3, an array under RESP2.
pub fn reply_values(ctx: Ctx, fields: &[(&CStr, Value)]) -> c_int {
    reply_named(ctx, fields, |value| {
        // SAFETY: ctx is live; bulk strings are copied by the server.
        unsafe {
            match value {
                Value::Int(n) => raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *n),
                Value::Bulk(b) => {
                    raw::RedisModule_ReplyWithStringBuffer.unwrap()(ctx, b.as_ptr().cast(), b.len())
                }
                Value::Null => raw::RedisModule_ReplyWithNull.unwrap()(ctx),
            };
        }
    })
}

/// A map of `fields` under RESP3 (names as simple strings), the values in
/// order under RESP2; `value` replies one value.
fn reply_named<T>(ctx: Ctx, fields: &[(&CStr, T)], value: impl Fn(&T)) -> c_int {
    reply_named_in(ctx, is_resp3(ctx), fields, value)
}

/// `reply_named` when the protocol is already known (RL.ALL asks once).
fn reply_named_in<T>(ctx: Ctx, resp3: bool, fields: &[(&CStr, T)], value: impl Fn(&T)) -> c_int {
    // SAFETY: ctx is live; names are static NUL-terminated strings.
    unsafe {
        if resp3 {
            raw::RedisModule_ReplyWithMap.unwrap()(ctx, fields.len() as _);
        } else {
            raw::RedisModule_ReplyWithArray.unwrap()(ctx, fields.len() as _);
        }
        for (name, v) in fields {
            if resp3 {
                raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, name.as_ptr());
            }
            value(v);
        }
    }
    raw::Status::Ok as c_int
}

/// RL.ALL's reply: under RESP3 a map {allowed, retry_after_ms, [granted,]
/// limiters: [map, ...]}; under RESP2 the array [allowed, retry_after_ms,
/// [granted,] [[...], ...]]. `granted` only with PARTIAL.
/// RL.ALL's reply. `flags` are the context's (`context_flags`), read once
/// per call by the caller.
pub fn reply_compound(
    ctx: Ctx,
    flags: ContextFlags,
    (allowed, retry_after, granted): (i64, i64, Option<i64>),
    limiters: impl ExactSizeIterator<Item = [(&'static CStr, i64); 5]>,
) -> c_int {
    let resp3 = flags.resp3();
    // SAFETY: ctx is live; names are static NUL-terminated strings.
    unsafe {
        let name = |n: &CStr| {
            if resp3 {
                raw::RedisModule_ReplyWithSimpleString.unwrap()(ctx, n.as_ptr());
            }
        };
        let len = 3 + i64::from(granted.is_some());
        if resp3 {
            raw::RedisModule_ReplyWithMap.unwrap()(ctx, len as _);
        } else {
            raw::RedisModule_ReplyWithArray.unwrap()(ctx, len as _);
        }
        name(c"allowed");
        raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, allowed);
        name(c"retry_after_ms");
        raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, retry_after);
        if let Some(granted) = granted {
            name(c"granted");
            raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, granted);
        }
        name(c"limiters");
        raw::RedisModule_ReplyWithArray.unwrap()(ctx, limiters.len() as _);
    }
    for fields in limiters {
        reply_named_in(ctx, resp3, &fields, |n| {
            // SAFETY: ctx is the live command context.
            unsafe { raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *n) };
        });
    }
    raw::Status::Ok as c_int
}

/// A nested reply built call by call: maps are maps under RESP3 and arrays
/// of their values under RESP2 (names are sent under RESP3 only).
pub struct Nested {
    ctx: Ctx,
    resp3: bool,
}

impl Nested {
    pub fn new(ctx: Ctx) -> Nested {
        Nested {
            ctx,
            resp3: is_resp3(ctx),
        }
    }

    pub fn map(&mut self, fields: usize) {
        // SAFETY: ctx is the live command context.
        unsafe {
            if self.resp3 {
                raw::RedisModule_ReplyWithMap.unwrap()(self.ctx, fields as _);
            } else {
                raw::RedisModule_ReplyWithArray.unwrap()(self.ctx, fields as _);
            }
        }
    }

    pub fn name(&mut self, name: &CStr) {
        if self.resp3 {
            // SAFETY: ctx is live; name is NUL-terminated.
            unsafe { raw::RedisModule_ReplyWithSimpleString.unwrap()(self.ctx, name.as_ptr()) };
        }
    }

    /// A map whose keys are data (bulk strings) in both protocols: a map
    /// under RESP3, a flat array of key, value, ... under RESP2 (as HGETALL).
    pub fn pairs(&mut self, len: usize) {
        // SAFETY: ctx is the live command context.
        unsafe {
            if self.resp3 {
                raw::RedisModule_ReplyWithMap.unwrap()(self.ctx, len as _);
            } else {
                raw::RedisModule_ReplyWithArray.unwrap()(self.ctx, (2 * len) as _);
            }
        }
    }

    pub fn array(&mut self, len: usize) {
        // SAFETY: ctx is the live command context.
        unsafe { raw::RedisModule_ReplyWithArray.unwrap()(self.ctx, len as _) };
    }

    pub fn int(&mut self, value: i64) {
        reply_integer(self.ctx, value);
    }

    pub fn bulk(&mut self, bytes: &[u8]) {
        // SAFETY: ctx is live; the buffer is copied by the server.
        unsafe {
            raw::RedisModule_ReplyWithStringBuffer.unwrap()(
                self.ctx,
                bytes.as_ptr().cast(),
                bytes.len(),
            )
        };
    }

    pub fn null(&mut self) {
        reply_null(self.ctx);
    }
}

/// Replies with an array of bulk strings.
pub fn reply_bulks<'a>(ctx: Ctx, items: impl ExactSizeIterator<Item = &'a [u8]>) -> c_int {
    // SAFETY: ctx is live; each buffer is copied by the server.
    unsafe {
        raw::RedisModule_ReplyWithArray.unwrap()(ctx, items.len() as _);
        for item in items {
            raw::RedisModule_ReplyWithStringBuffer.unwrap()(ctx, item.as_ptr().cast(), item.len());
        }
    }
    raw::Status::Ok as c_int
}

/// Replies with a plain array of integers, whatever the protocol.
pub fn reply_integers(ctx: Ctx, values: &[i64]) -> c_int {
    // SAFETY: ctx is the live command context.
    unsafe {
        raw::RedisModule_ReplyWithArray.unwrap()(ctx, values.len() as _);
        for value in values {
            raw::RedisModule_ReplyWithLongLong.unwrap()(ctx, *value);
        }
    }
    raw::Status::Ok as c_int
}

/// What a key holds, from this module's point of view.
pub enum Slot<'k, T> {
    Empty,
    Ours(&'k mut T),
    Foreign,
}

/// An open key, closed when dropped. At most one handle per key at a time.
pub struct Key {
    ptr: NonNull<raw::RedisModuleKey>,
}

impl Key {
    /// `None` when the key is opened read-only and does not exist (the
    /// server then hands out no handle).
    pub fn open(ctx: Ctx, name: Str, write: bool) -> Option<Key> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: ctx and name are live for the command.
        let ptr = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode as c_int) };
        NonNull::new(ptr.cast()).map(|ptr| Key { ptr })
    }

    fn raw(&self) -> *mut raw::RedisModuleKey {
        self.ptr.as_ptr()
    }

    /// The value if it is of type `ty` (whose values are `Box<T>` pointers).
    pub fn get<T>(&mut self, ty: *mut raw::RedisModuleType) -> Slot<'_, T> {
        // SAFETY: the key handle is open; a value of our type was stored by
        // `set` below as a Box<T> and stays owned by the server.
        unsafe {
            let kind = raw::RedisModule_KeyType.unwrap()(self.raw()) as isize;
            if kind == raw::REDISMODULE_KEYTYPE_EMPTY {
                return Slot::Empty;
            }
            if kind != raw::REDISMODULE_KEYTYPE_MODULE
                || raw::RedisModule_ModuleTypeGetType.unwrap()(self.raw()) != ty
            {
                return Slot::Foreign;
            }
            let value = raw::RedisModule_ModuleTypeGetValue.unwrap()(self.raw()).cast::<T>();
            match value.as_mut() {
                Some(value) => Slot::Ours(value),
                None => Slot::Foreign,
            }
        }
    }

    /// Stores a new value (the server frees the old one through the type's
    /// free callback). Drops the key's TTL: set the expiry afterwards.
    pub fn set<T>(&mut self, ty: *mut raw::RedisModuleType, value: Box<T>) -> bool {
        let ptr = Box::into_raw(value);
        // SAFETY: the key is open for writing; ownership of `ptr` passes to the server.
        let status = unsafe {
            raw::RedisModule_ModuleTypeSetValue.unwrap()(self.raw(), ty, ptr.cast::<c_void>())
        };
        if status != raw::Status::Ok as c_int {
            // SAFETY: the server did not take the pointer; reclaim it.
            drop(unsafe { Box::from_raw(ptr) });
            return false;
        }
        true
    }

    /// Whether the key's expiry has passed by `at` (the server deletes a key
    /// only once its time is strictly behind the clock).
    pub fn expired_by(&mut self, at: Millis) -> bool {
        // SAFETY: the key is open; -1 means no expiry.
        let when = unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.raw()) };
        when >= 0 && when < at.to_i64_saturating()
    }

    /// The key's absolute expiry, if it has one.
    pub fn expiry(&mut self) -> Option<Millis> {
        // SAFETY: the key is open; -1 means no expiry.
        let when = unsafe { raw::RedisModule_GetAbsExpire.unwrap()(self.raw()) };
        u64::try_from(when).ok().map(Millis)
    }

    /// Sets the absolute expiry in Unix milliseconds, unless the key already
    /// has exactly that one (a window's stays put for the whole window).
    pub fn expire_at(&mut self, at: Millis) {
        let at = at.to_i64_saturating();
        // SAFETY: the key is open for writing and holds a value.
        unsafe {
            if raw::RedisModule_GetAbsExpire.unwrap()(self.raw()) != at {
                raw::RedisModule_SetAbsExpire.unwrap()(self.raw(), at);
            }
        }
    }
}

/// Whether `name` holds a key (of any type) in the context's db.
pub fn key_exists(ctx: Ctx, name: Str) -> bool {
    Key::open(ctx, name, false).is_some()
}

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `open` and is closed exactly once.
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.raw()) }
    }
}

/// Tells the server the key changed (WATCH, client-side caching). The module
/// opts out of the implicit signal on every write-mode close, so a denied
/// request does not abort other clients' transactions.
pub fn signal_modified(ctx: Ctx, key: Str) {
    // SAFETY: ctx and key are live for the command.
    unsafe {
        raw::RedisModule_SignalModifiedKey.unwrap()(ctx, key);
    }
}

/// Emits a keyspace event of the module class (`d` in
/// notify-keyspace-events) for `key`.
pub fn notify(ctx: Ctx, event: &CStr, key: Str) {
    // SAFETY: ctx and key are live for the command; the event name is a
    // NUL-terminated static string the server copies.
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx,
            raw::NotifyEvent::MODULE.bits(),
            event.as_ptr(),
            key,
        );
    }
}

/// Writes a warning to the server log.
pub fn log_warning(ctx: Ctx, message: &CStr) {
    // SAFETY: ctx is live; "%s" with one NUL-terminated string.
    unsafe {
        raw::RedisModule_Log.unwrap()(ctx, c"warning".as_ptr(), c"%s".as_ptr(), message.as_ptr());
    }
}

/// Queues `command key blob [key blob ...]` for replicas and the AOF, in one
/// entry: RL.ALL's changes, which share a slot, cost one propagation. None
/// when there are more pairs than the varargs forms below (the caller then
/// queues them one by one).
pub fn replicate_pairs(ctx: Ctx, command: &CStr, pairs: &[(Str, &[u8])]) -> Option<bool> {
    // One varargs call per pair count: "sb" per pair, a RedisModuleString
    // then a (pointer, length) buffer.
    macro_rules! replicate {
        ($format:expr, $($i:literal),+) => {
            raw::RedisModule_Replicate.unwrap()(
                ctx,
                command.as_ptr(),
                $format.as_ptr(),
                $(pairs[$i].0, pairs[$i].1.as_ptr(), pairs[$i].1.len()),+
            )
        };
    }
    // SAFETY: the API table is set once at load, before any command runs;
    // the server copies every string and buffer before it returns.
    let status = unsafe {
        match pairs.len() {
            1 => replicate!(c"sb", 0),
            2 => replicate!(c"sbsb", 0, 1),
            3 => replicate!(c"sbsbsb", 0, 1, 2),
            4 => replicate!(c"sbsbsbsb", 0, 1, 2, 3),
            _ => return None,
        }
    };
    Some(status == raw::Status::Ok as c_int)
}

/// Queues the client's own command for replicas and the AOF (and counts a
/// change for the save points).
pub fn replicate_verbatim(ctx: Ctx) {
    // SAFETY: ctx is the live command context.
    unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(ctx) };
}

/// Real allocation size of a pointer from the server's allocator.
pub fn malloc_size(ptr: *const c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    // SAFETY: every heap allocation of this module goes through the
    // server's allocator (the crate installs it as the global allocator).
    unsafe { raw::RedisModule_MallocSize.unwrap()(ptr as *mut c_void) }
}
