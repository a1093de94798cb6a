//! Stored policies: a named limiter definition (`RL.POLICY.SET api WINDOW
//! 100 1m`) that `RL.LIMIT key api` applies, so a limit is changed for every
//! key at once and each call parses two arguments fewer.
//!
//! Policies are node-wide data, as functions are: set on a primary, they
//! reach replicas and the AOF as the same deterministic command
//! (verbatim), and RDB files (and the AOF's RDB preamble) as module aux
//! data written before the keys. A full sync or a reload replaces them
//! whole. An AOF rewritten without the RDB preamble carries them at the
//! head of the first limiter key it writes (the server has no other place
//! for module data there). In a cluster each primary holds its own: define
//! them on every primary, as with FUNCTION LOAD.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::c_int;

use valkey_module::raw;

use super::ffi::{self, Argv, Ctx, Str};
use super::policy_stats::{self, PolicyId};
use super::{commands, limiters};
use crate::args::{self, Args, PolicyDefinition};
use crate::core::policy::Policy;

/// More would be a bug in the caller (a policy per user belongs in the key).
pub const MAX_POLICIES: usize = 10_000;

struct Stored {
    policy: Policy,
    /// RL.LIMIT replies BRIEF.
    brief: bool,
    /// The words after the name, as given: what GET shows and the RDB and
    /// the AOF keep (parsed again when loaded).
    definition: Vec<Vec<u8>>,
    /// Its counters (policy_stats.rs): new at every definition and load.
    id: PolicyId,
}

fn stored(name: &[u8], parsed: PolicyDefinition, definition: Vec<Vec<u8>>) -> Stored {
    Stored {
        policy: parsed.policy,
        brief: parsed.brief,
        definition,
        id: policy_stats::register(name, ffi::now()),
    }
}

fn forget_all(registry: &Registry) {
    for stored in registry.values() {
        policy_stats::forget(stored.id);
    }
}

type Registry = BTreeMap<Vec<u8>, Stored>;

thread_local! {
    // Commands and callbacks all run on the server's main thread; an RDB or
    // AOF child has its own copy.
    static POLICIES: RefCell<Registry> = const { RefCell::new(BTreeMap::new()) };
    /// The policies of before a load, given back if the load fails.
    static BEFORE_LOAD: RefCell<Option<Registry>> = const { RefCell::new(None) };
    /// The process (an AOF rewrite child) that has emitted them already.
    static EMITTED_BY: Cell<u32> = const { Cell::new(0) };
}

impl Args for [Vec<u8>] {
    fn count(&self) -> usize {
        self.len()
    }
    fn get(&self, index: usize) -> &[u8] {
        &self[index]
    }
}

/// `RL.POLICY.SET name definition...`: defines or replaces a policy.
pub fn set(ctx: Ctx, argv: &[Str]) -> c_int {
    let name = match args::policy_name(ffi::bytes(argv[1])) {
        Ok(name) => name.to_vec(),
        Err(error) => return commands::fail(ctx, &error.0),
    };
    let definition: Vec<Vec<u8>> = argv[2..].iter().map(|s| ffi::bytes(*s).to_vec()).collect();
    let policy = match args::policy_definition(definition.as_slice()) {
        Ok(policy) => policy,
        Err(error) => return commands::fail(ctx, &error.0),
    };
    let full = POLICIES.with_borrow(|p| p.len() >= MAX_POLICIES && !p.contains_key(&name));
    if full {
        return commands::fail(
            ctx,
            &format!("ERR there are {MAX_POLICIES} policies already: delete one first"),
        );
    }
    let entry = stored(&name, policy, definition);
    let replaced = POLICIES.with_borrow_mut(|p| p.insert(name, entry));
    if let Some(old) = replaced {
        policy_stats::forget(old.id);
    }
    ffi::replicate_verbatim(ctx);
    ffi::reply_ok(ctx)
}

/// `RL.POLICY.GET name`: the definition, or nil.
pub fn get(ctx: Ctx, argv: &[Str]) -> c_int {
    POLICIES.with_borrow(|p| match p.get(ffi::bytes(argv[1])) {
        Some(stored) => ffi::reply_bulks(ctx, stored.definition.iter().map(Vec::as_slice)),
        None => ffi::reply_null(ctx),
    })
}

/// `RL.POLICY.DEL name [name ...]`: how many were deleted. Keys limited by
/// a deleted policy keep their state; RL.LIMIT on them fails until the
/// policy is set again.
pub fn del(ctx: Ctx, argv: &[Str]) -> c_int {
    let deleted = POLICIES.with_borrow_mut(|p| {
        argv[1..]
            .iter()
            .filter_map(|name| p.remove(ffi::bytes(*name)))
            .map(|old| policy_stats::forget(old.id))
            .count()
    });
    if deleted > 0 {
        ffi::replicate_verbatim(ctx);
    }
    ffi::reply_integer(ctx, deleted as i64)
}

/// `RL.POLICY.LIST`: the names, sorted.
pub fn list(ctx: Ctx, _argv: &[Str]) -> c_int {
    POLICIES.with_borrow(|p| ffi::reply_bulks(ctx, p.keys().map(Vec::as_slice)))
}

/// The policy stored under `name`, and the id its calls are counted under.
/// (RL.ALL: its reply is the call's, so a policy's BRIEF does not apply.)
pub fn lookup(name: &[u8]) -> Option<(Policy, PolicyId)> {
    POLICIES.with_borrow(|p| p.get(name).map(|s| (s.policy, s.id)))
}

/// The policies `argv` names (all of them when it names none, sorted), each
/// with its counters' id (None: no such policy).
fn named(argv: &[Str]) -> Vec<(Vec<u8>, Option<PolicyId>)> {
    POLICIES.with_borrow(|p| {
        if argv.is_empty() {
            return p.iter().map(|(n, s)| (n.clone(), Some(s.id))).collect();
        }
        argv.iter()
            .map(|name| {
                let name = ffi::bytes(*name);
                (name.to_vec(), p.get(name).map(|s| s.id))
            })
            .collect()
    })
}

/// `RL.POLICY.STATS [name ...]`: each policy's counters (nil for a name
/// that is no policy), as a map from name to {allowed, denied,
/// shadow_denied, lockouts, since_ms} (RESP2: name, [values], ...).
pub fn stats(ctx: Ctx, argv: &[Str]) -> c_int {
    let policies = named(&argv[1..]);
    let mut out = ffi::Nested::new(ctx);
    out.pairs(policies.len());
    for (name, id) in policies {
        out.bulk(&name);
        match id.and_then(policy_stats::get) {
            None => out.null(),
            Some(stats) => {
                out.map(5);
                for (field, value) in [
                    (c"allowed", stats.allowed),
                    (c"denied", stats.denied),
                    (c"shadow_denied", stats.shadow_denied),
                    (c"lockouts", stats.lockouts),
                    (c"since_ms", stats.since.0),
                ] {
                    out.name(field);
                    out.int(i64::try_from(value).unwrap_or(i64::MAX));
                }
            }
        }
    }
    raw::Status::Ok as c_int
}

/// `RL.POLICY.RESETSTATS [name ...]`: starts the named policies' counters
/// (all when none is named) at zero; replies how many were reset.
pub fn reset_stats(ctx: Ctx, argv: &[Str]) -> c_int {
    let now = ffi::now();
    let reset = named(&argv[1..])
        .into_iter()
        .filter_map(|(_, id)| id)
        .map(|id| policy_stats::reset(id, now))
        .count();
    ffi::reply_integer(ctx, reset as i64)
}

/// `RL.LIMIT key policy [options]`: the policy's command on `key`.
pub fn limit(ctx: Ctx, argv: &[Str]) -> c_int {
    let found = POLICIES.with_borrow(|p| {
        p.get(ffi::bytes(argv[2])).map(|s| {
            let definition = PolicyDefinition {
                policy: s.policy,
                brief: s.brief,
            };
            (definition, s.id)
        })
    });
    let Some((definition, id)) = found else {
        return commands::fail(
            ctx,
            &format!(
                "ERR no policy named '{}' on this node (RL.POLICY.SET defines one; in a cluster, on every primary)",
                String::from_utf8_lossy(ffi::bytes(argv[2]))
            ),
        );
    };
    match args::limit_options(&Argv(&argv[3..]), &definition) {
        Ok(options) => {
            let options = args::Options {
                policy: Some(id),
                ..options
            };
            limiters::start(ctx, argv[1], definition.policy, options)
        }
        Err(error) => commands::fail(ctx, &error.0),
    }
}

/// A load (startup, full sync, DEBUG RELOAD) replaces the policies with
/// the file's; a failed one (an aborted diskless sync) restores them.
pub fn on_loading(subevent: u64) {
    match subevent {
        raw::REDISMODULE_SUBEVENT_LOADING_ENDED => {
            if let Some(before) = BEFORE_LOAD.take() {
                forget_all(&before);
            }
        }
        raw::REDISMODULE_SUBEVENT_LOADING_FAILED => {
            if let Some(before) = BEFORE_LOAD.take() {
                forget_all(&POLICIES.replace(before));
            }
        }
        _ => {
            let before = POLICIES.take();
            BEFORE_LOAD.set(Some(before));
        }
    }
}

/// Aux data, before the keys: the count, then each name, its word count and
/// words. Nothing at all when there are none (the file then loads without
/// the module, as before policies existed).
///
/// # Safety
/// Called by the server with a live RDB handle.
pub unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    let _ = std::panic::catch_unwind(|| save_policies(rdb, when));
}

unsafe fn save_policies(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        return;
    }
    POLICIES.with_borrow(|p| {
        if p.is_empty() {
            return;
        }
        let save = |bytes: &[u8]| {
            raw::RedisModule_SaveStringBuffer.unwrap()(rdb, bytes.as_ptr().cast(), bytes.len())
        };
        raw::RedisModule_SaveUnsigned.unwrap()(rdb, p.len() as u64);
        for (name, stored) in p {
            save(name);
            raw::RedisModule_SaveUnsigned.unwrap()(rdb, stored.definition.len() as u64);
            for word in &stored.definition {
                save(word);
            }
        }
    });
}

/// Reads what `aux_save` wrote; a definition that does not parse fails the
/// load, as a bad key does.
///
/// # Safety
/// Called by the server with a live RDB handle.
pub unsafe extern "C" fn aux_load(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    when: c_int,
) -> c_int {
    std::panic::catch_unwind(|| load_policies(rdb, encver, when))
        .unwrap_or(raw::Status::Err as c_int)
}

unsafe fn load_policies(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    let err = raw::Status::Err as c_int;
    if encver > super::keytype::ENCODING_VERSION {
        return err;
    }
    if when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        return raw::Status::Ok as c_int;
    }
    let failed = || raw::RedisModule_IsIOError.unwrap()(rdb) != 0;
    let load = || -> Option<Vec<u8>> {
        let mut len = 0usize;
        let buffer = raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len);
        if failed() || buffer.is_null() {
            return None;
        }
        let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), len).to_vec();
        raw::RedisModule_Free.unwrap()(buffer.cast());
        Some(bytes)
    };
    let count = raw::RedisModule_LoadUnsigned.unwrap()(rdb);
    if failed() || count as usize > MAX_POLICIES {
        return err;
    }
    let mut loaded = BTreeMap::new();
    for _ in 0..count {
        let Some(name) = load().filter(|n| args::policy_name(n).is_ok()) else {
            return err;
        };
        let words = raw::RedisModule_LoadUnsigned.unwrap()(rdb);
        if failed() || words > 8 {
            return err;
        }
        let Some(definition) = (0..words).map(|_| load()).collect::<Option<Vec<_>>>() else {
            return err;
        };
        let Ok(policy) = args::policy_definition(definition.as_slice()) else {
            return err;
        };
        loaded.insert(name, (policy, definition));
    }
    POLICIES.with_borrow_mut(|p| {
        for (name, (policy, definition)) in loaded {
            let entry = stored(&name, policy, definition);
            if let Some(old) = p.insert(name, entry) {
                policy_stats::forget(old.id);
            }
        }
    });
    raw::Status::Ok as c_int
}

/// In an AOF rewrite without the RDB preamble: the policies as RL.POLICY.SET
/// commands, once per rewrite (the first limiter key's callback calls it).
///
/// # Safety
/// Called from the type's `aof_rewrite` with its live AOF handle.
pub unsafe fn emit_once(aof: *mut raw::RedisModuleIO) {
    let pid = std::process::id();
    if EMITTED_BY.get() == pid {
        return;
    }
    EMITTED_BY.set(pid);
    POLICIES.with_borrow(|p| {
        for (name, stored) in p {
            let words: Vec<*mut raw::RedisModuleString> = std::iter::once(name)
                .chain(&stored.definition)
                .map(|w| {
                    raw::RedisModule_CreateString.unwrap()(
                        std::ptr::null_mut(),
                        w.as_ptr().cast(),
                        w.len(),
                    )
                })
                .collect();
            // "v": a vector of strings, copied into the AOF before returning.
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                c"rl.policy.set".as_ptr(),
                c"v".as_ptr(),
                words.as_ptr(),
                words.len(),
            );
            for word in words {
                raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), word);
            }
        }
    });
}
