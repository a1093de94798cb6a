//! Command registration: names, flags, key positions, arity, docs and ACL
//! categories, in one table. Every entry point catches panics, so a bug
//! becomes an error reply instead of a crashed server.

use std::ffi::{c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use valkey_module::raw;

use super::ffi::{self, Ctx, Str, KEY_UPDATE};
use super::{compound, denied_report, docs, leases, limiters, replication, stored};

pub const ACL_CATEGORY: &CStr = c"ratelimit";

type Handler = fn(Ctx, &[Str]) -> c_int;
type Entry = unsafe extern "C" fn(Ctx, *mut Str, c_int) -> c_int;

struct Spec {
    name: &'static CStr,
    entry: Entry,
    flags: &'static CStr,
    /// Negative: at least that many arguments, the command name included.
    arity: c_int,
    summary: &'static CStr,
    complexity: &'static CStr,
    /// The release that added the command (`COMMAND DOCS` since, the
    /// command files' module_since).
    since: &'static CStr,
    acl_categories: Option<&'static CStr>,
    /// Key spec flags of the keys.
    key_flags: u32,
    keys: Keys,
    /// The argument list `COMMAND DOCS` shows.
    args: &'static [docs::Arg],
}

/// Where a command's keys are.
#[derive(Clone, Copy)]
enum Keys {
    /// One key, at argument 1.
    First,
    /// `numkeys` at argument 1, then that many keys (RL.ALL).
    Counted,
    /// No keys: node-wide data (stored policies).
    Keyless,
    /// `key value [key value ...]` from argument 1 (RL.APPLY).
    Pairs,
}

const KEY_READ: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
/// RL.APPLY replaces or updates the value without revealing it.
const KEY_APPLY: u32 = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// The key spec of `keys`, plus the zeroed terminator the API expects.
/// `RedisModule_SetCommandInfo` copies it, so the caller frees it after.
fn key_spec(flags: u32, keys: Keys) -> Box<[raw::RedisModuleCommandKeySpec; 2]> {
    // SAFETY: an all-zero key spec is the documented array terminator.
    let terminator: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    if let Keys::Keyless = keys {
        return Box::new([terminator, terminator]);
    }
    let mut spec = terminator;
    spec.flags = u64::from(flags);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    match keys {
        Keys::First => {
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range.lastkey = 0;
            spec.fk.range.keystep = 1;
            spec.fk.range.limit = 0;
        }
        Keys::Pairs => {
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
            spec.fk.range.lastkey = -1;
            spec.fk.range.keystep = 2;
            spec.fk.range.limit = 0;
        }
        Keys::Counted => {
            // Counted from the begin-search index: numkeys there, keys after it.
            spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
            spec.fk.keynum.keynumidx = 0;
            spec.fk.keynum.firstkey = 1;
            spec.fk.keynum.keystep = 1;
        }
        Keys::Keyless => {}
    }
    Box::new([spec, terminator])
}

/// `min`: the fewest arguments (the name included) the handler indexes.
fn guard(ctx: Ctx, argv: *mut Str, argc: c_int, handler: Handler, min: usize) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the server passes `argc` live argument strings.
        let args = unsafe { std::slice::from_raw_parts(argv, usize::try_from(argc).unwrap_or(0)) };
        if args.len() < min {
            return ffi::reply_error(ctx, "ERR wrong number of arguments");
        }
        handler(ctx, args)
    }));
    outcome.unwrap_or_else(|_| {
        ffi::reply_error(
            ctx,
            "ERR internal error in the ratelimit module (please report it)",
        )
    })
}

macro_rules! entry_point {
    ($name:ident, $handler:path) => {
        entry_point!($name, $handler, 2);
    };
    ($name:ident, $handler:path, $min:expr) => {
        /// # Safety
        /// Called by the server with a live context and `argc` arguments.
        unsafe extern "C" fn $name(ctx: Ctx, argv: *mut Str, argc: c_int) -> c_int {
            guard(ctx, argv, argc, $handler, $min)
        }
    };
}

entry_point!(token_bucket_entry, limiters::token_bucket);
entry_point!(window_entry, limiters::window);
entry_point!(sliding_log_entry, limiters::sliding_log);
entry_point!(gcra_entry, limiters::gcra);
entry_point!(all_entry, compound::all);
entry_point!(refund_entry, limiters::refund);
entry_point!(unlock_entry, limiters::unlock);
entry_point!(rl_throttle_entry, limiters::rl_throttle);
entry_point!(cl_throttle_entry, limiters::cl_throttle);
entry_point!(apply_entry, apply_handler);
entry_point!(lease_entry, leases::acquire);
entry_point!(release_entry, release_handler);
entry_point!(extend_entry, extend_handler);
entry_point!(peek_entry, peek_handler);
entry_point!(inspect_entry, inspect_handler);
entry_point!(limit_entry, stored::limit, 3);
entry_point!(policy_set_entry, stored::set, 3);
entry_point!(policy_get_entry, policy_get_handler);
entry_point!(policy_del_entry, stored::del);
entry_point!(policy_list_entry, policy_list_handler, 1);
entry_point!(top_denied_entry, denied_report::top_denied, 1);
entry_point!(policy_stats_entry, stored::stats, 1);
entry_point!(policy_reset_stats_entry, stored::reset_stats, 1);

fn policy_get_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 2 {
        return ffi::reply_error(ctx, "ERR wrong number of arguments: RL.POLICY.GET name");
    }
    stored::get(ctx, argv)
}

fn policy_list_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 1 {
        return ffi::reply_error(
            ctx,
            "ERR wrong number of arguments: RL.POLICY.LIST takes none",
        );
    }
    stored::list(ctx, argv)
}

fn peek_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 2 {
        return ffi::reply_error(ctx, "ERR wrong number of arguments for 'rl.peek' command");
    }
    limiters::peek(ctx, argv)
}

fn inspect_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 2 {
        return ffi::reply_error(ctx, "ERR wrong number of arguments: RL.INSPECT key");
    }
    limiters::inspect(ctx, argv)
}

fn release_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 3 {
        return ffi::reply_error(
            ctx,
            "ERR wrong number of arguments: RL.RELEASE key lease_id",
        );
    }
    leases::release(ctx, argv)
}

fn extend_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() != 4 {
        return ffi::reply_error(
            ctx,
            "ERR wrong number of arguments: RL.EXTEND key lease_id ttl",
        );
    }
    leases::extend(ctx, argv)
}

fn apply_handler(ctx: Ctx, argv: &[Str]) -> c_int {
    if argv.len() < 3 || argv.len().is_multiple_of(2) {
        return ffi::reply_error(ctx, "ERR wrong number of arguments for 'rl.apply' command");
    }
    replication::apply_command(ctx, argv)
}

const LIMITER_FLAGS: &CStr = c"write deny-oom fast";
/// Core commands get @write/@fast from their flags; module commands get only
/// what the module sets, so name them too (`+@write -@slow` users expect them).
const LIMITER_CATEGORIES: &CStr = c"write fast ratelimit";
/// Commands that take BLOCK: flagged and categorised as XREAD is.
const BLOCKING_FLAGS: &CStr = c"write deny-oom fast blocking";
const BLOCKING_CATEGORIES: &CStr = c"write fast blocking ratelimit";
/// Giving slots back must work when memory is short (as DEL does).
const RELEASE_FLAGS: &CStr = c"write fast";

static COMMANDS: [Spec; 22] = [
    Spec {
        name: c"rl.tokenbucket",
        entry: token_bucket_entry,
        flags: BLOCKING_FLAGS,
        arity: -5,
        summary: c"Takes COST tokens from a token bucket of `capacity` refilled at `refill_amount` per `refill_period`, if that many are there.",
        complexity: c"O(1)",
        since: SINCE_0_1_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::TOKEN_BUCKET,
    },
    Spec {
        name: c"rl.window",
        entry: window_entry,
        flags: BLOCKING_FLAGS,
        arity: -4,
        summary: c"Counts COST in a fixed window (or, with SLIDING, a sliding window counter) of `period`, or in the calendar's day, week, month or year (TZ, ANCHOR), if it stays within `limit`.",
        complexity: c"O(1)",
        since: SINCE_0_1_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::WINDOW,
    },
    Spec {
        name: c"rl.slidinglog",
        entry: sliding_log_entry,
        flags: BLOCKING_FLAGS,
        arity: -4,
        summary: c"Logs COST in an exact sliding log of `period`, if the cost logged in the last `period` stays within `limit`.",
        complexity: c"O(1) amortized. A denied request also walks the oldest entries that must expire before it fits.",
        since: SINCE_0_1_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::SLIDING_LOG,
    },
    Spec {
        name: c"rl.gcra",
        entry: gcra_entry,
        flags: BLOCKING_FLAGS,
        arity: -5,
        summary: c"GCRA: admits COST requests when they fit in a burst of `burst` on a schedule of `rate` per `period`.",
        complexity: c"O(1)",
        since: SINCE_0_1_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::GCRA,
    },
    Spec {
        name: c"rl.limit",
        entry: limit_entry,
        flags: BLOCKING_FLAGS,
        arity: -3,
        summary: c"Applies the stored policy `policy` (RL.POLICY.SET) to the key: the same as calling its algorithm's command with its parameters.",
        complexity: c"O(1), as the policy's command.",
        since: SINCE_1_0_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::LIMIT,
    },
    Spec {
        name: c"rl.policy.set",
        entry: policy_set_entry,
        flags: c"write deny-oom",
        arity: -5,
        summary: c"Defines or replaces a named policy (an algorithm and its parameters) on this node; replicated and persisted. Every key limited by it follows the change at its next call.",
        complexity: c"O(log N) for N policies.",
        since: SINCE_1_0_0,
        // Not @ratelimit: an application allowed to use limits may not set them.
        acl_categories: Some(c"write"),
        key_flags: 0,
        keys: Keys::Keyless,
        args: docs::POLICY_SET,
    },
    Spec {
        name: c"rl.policy.get",
        entry: policy_get_entry,
        flags: c"readonly fast",
        arity: 2,
        summary: c"Returns a policy's definition as it was given, or nil.",
        complexity: c"O(log N) for N policies.",
        since: SINCE_1_0_0,
        acl_categories: Some(c"read fast ratelimit"),
        key_flags: 0,
        keys: Keys::Keyless,
        args: docs::POLICY_NAME,
    },
    Spec {
        name: c"rl.policy.del",
        entry: policy_del_entry,
        flags: c"write",
        arity: -2,
        summary: c"Deletes policies; replies how many existed. Keys keep their state.",
        complexity: c"O(M log N) for M names and N policies.",
        since: SINCE_1_0_0,
        acl_categories: Some(c"write"),
        key_flags: 0,
        keys: Keys::Keyless,
        args: docs::POLICY_NAMES,
    },
    Spec {
        name: c"rl.policy.list",
        entry: policy_list_entry,
        flags: c"readonly",
        arity: 1,
        summary: c"Returns the names of the policies on this node, sorted.",
        complexity: c"O(N) for N policies.",
        since: SINCE_1_0_0,
        acl_categories: Some(c"read ratelimit"),
        key_flags: 0,
        keys: Keys::Keyless,
        args: &[],
    },
    Spec {
        name: c"rl.policy.stats",
        entry: policy_stats_entry,
        flags: c"readonly",
        arity: -1,
        summary: c"Returns each policy's counters on this node (allowed, denied, shadow_denied, lockouts) since it was set or reset.",
        complexity: c"O(M log N) for M names (or all N policies).",
        acl_categories: Some(c"read ratelimit"),
        key_flags: 0,
        keys: Keys::Keyless,
        since: c"1.0.0",
        args: docs::POLICY_NAMES_OPTIONAL,
    },
    Spec {
        name: c"rl.policy.resetstats",
        entry: policy_reset_stats_entry,
        flags: c"",
        arity: -1,
        summary: c"Starts the counters of the named policies (all when none is named) at zero on this node.",
        complexity: c"O(M log N) for M names (or all N policies).",
        acl_categories: None,
        key_flags: 0,
        keys: Keys::Keyless,
        since: c"1.0.0",
        args: docs::POLICY_NAMES_OPTIONAL,
    },
    Spec {
        name: c"rl.topdenied",
        entry: top_denied_entry,
        flags: c"readonly",
        arity: -1,
        summary: c"Returns the keys denied most often on this node in the current and the previous interval, with their counts and error bounds.",
        complexity: c"O(S log S) for S = ratelimit.denied-report-size.",
        acl_categories: Some(c"read ratelimit"),
        key_flags: 0,
        keys: Keys::Keyless,
        since: c"1.0.0",
        args: docs::TOP_DENIED,
    },
    Spec {
        name: c"rl.throttle",
        entry: rl_throttle_entry,
        flags: LIMITER_FLAGS,
        arity: -5,
        summary: c"GCRA with redis-cell's arguments (limit = max_burst + 1) and the standard reply; the same limiter as RL.GCRA.",
        complexity: c"O(1)",
        since: SINCE_0_1_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::THROTTLE,
    },
    Spec {
        name: c"rl.all",
        entry: all_entry,
        flags: c"write deny-oom fast getkeys-api",
        arity: -5,
        summary: c"Applies one request to several limiters (one per key, any algorithms), consuming from all of them only when every one allows it.",
        complexity: c"O(N) for N limiters, each as its own command.",
        since: SINCE_0_1_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::Counted,
        args: docs::ALL,
    },
    Spec {
        name: c"rl.lease",
        entry: lease_entry,
        flags: BLOCKING_FLAGS,
        arity: -4,
        summary: c"Takes COST of `limit` slots for `ttl`, if that many are free: replies a lease id to release or extend it by. An unreleased lease frees its slots when its ttl passes.",
        complexity: c"O(N) for N leases held.",
        since: SINCE_1_0_0,
        acl_categories: Some(BLOCKING_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::LEASE,
    },
    Spec {
        name: c"rl.release",
        entry: release_entry,
        flags: RELEASE_FLAGS,
        arity: 3,
        summary: c"Gives a lease's slots back now. Replies 1 when the lease was held, 0 when not (released already, expired, or never granted).",
        complexity: c"O(N) for N leases held.",
        since: SINCE_1_0_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::RELEASE,
    },
    Spec {
        name: c"rl.extend",
        entry: extend_entry,
        flags: RELEASE_FLAGS,
        arity: 4,
        summary: c"Keeps a lease until now + ttl (a heartbeat). Replies 1 when the lease was held, 0 when not (an expired lease is not revived).",
        complexity: c"O(N) for N leases held.",
        since: SINCE_1_0_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::EXTEND,
    },
    Spec {
        name: c"rl.refund",
        entry: refund_entry,
        flags: LIMITER_FLAGS,
        arity: 3,
        summary: c"Gives back up to `amount` units to a limiter (tokens, the current window's count, the newest logged cost, GCRA time).",
        complexity: c"O(1), or O(N) for a sliding log of N entries.",
        since: SINCE_0_1_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::REFUND,
    },
    Spec {
        name: c"rl.unlock",
        entry: unlock_entry,
        flags: LIMITER_FLAGS,
        arity: 2,
        summary: c"Ends a lockout (LOCKOUT) now, keeping the limiter's counts. Replies 1 when a lock was lifted.",
        complexity: c"O(1), or O(N) for a sliding log of N entries.",
        since: SINCE_0_1_0,
        acl_categories: Some(LIMITER_CATEGORIES),
        key_flags: KEY_UPDATE,
        keys: Keys::First,
        args: docs::KEY_ONLY,
    },
    Spec {
        name: c"rl.peek",
        entry: peek_entry,
        flags: c"readonly fast",
        arity: 2,
        summary: c"Returns a limiter's state under its own parameters without changing it; runs on replicas. Nil when the key holds no limiter.",
        complexity: c"O(1), or O(N) for a sliding log whose N oldest entries have expired.",
        since: SINCE_0_1_0,
        acl_categories: Some(c"read fast ratelimit"),
        key_flags: KEY_READ,
        keys: Keys::First,
        args: docs::KEY_ONLY,
    },
    Spec {
        name: c"rl.inspect",
        entry: inspect_entry,
        flags: c"readonly fast",
        arity: 2,
        summary: c"Returns a limiter's raw state (algorithm, parameters, counts, times) as named fields without changing it; runs on replicas. Nil when the key holds no limiter.",
        complexity: c"O(1), or O(N) for a sliding log of N entries.",
        acl_categories: Some(c"read fast ratelimit"),
        key_flags: KEY_READ,
        keys: Keys::First,
        since: c"1.0.0",
        args: docs::KEY_ONLY,
    },
    Spec {
        name: c"rl.apply",
        entry: apply_entry,
        // admin: only replication, AOF loading and administrators run it.
        flags: c"write deny-oom admin",
        arity: -3,
        summary: c"Internal: applies the limiter changes propagated by the RL commands (replication and AOF): one key and effect, or one pair per key an RL.ALL call changed.",
        complexity: c"O(1), or O(N) for a whole sliding log of N entries (AOF rewrite).",
        since: SINCE_0_1_0,
        acl_categories: None,
        key_flags: KEY_APPLY,
        keys: Keys::Pairs,
        args: docs::APPLY,
    },
];

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// The releases that added commands.
const SINCE_0_1_0: &CStr = c"0.1.0";
const SINCE_1_0_0: &CStr = c"1.0.0";

/// redis-cell's command name, registered unless switched off or taken.
static CL_THROTTLE: Spec = Spec {
    name: c"cl.throttle",
    entry: cl_throttle_entry,
    flags: LIMITER_FLAGS,
    arity: -5,
    summary: c"redis-cell compatible GCRA: replies [limited, limit, remaining, retry_after_s, reset_after_s] as redis-cell does.",
    complexity: c"O(1)",
    since: SINCE_0_1_0,
    acl_categories: Some(LIMITER_CATEGORIES),
    key_flags: KEY_UPDATE,
    keys: Keys::First,
        args: docs::THROTTLE,
};

/// The oldest server this module supports: Valkey 8.0 (module configs,
/// `AddACLCategory`, the key spec and command info APIs it relies on).
pub const OLDEST_VALKEY: (u32, u32) = (8, 0);

/// Whether a server that calls itself `name` at `version` ("8.0.1") is one
/// this module supports; Err says why not, for the server log.
pub fn supported(name: &str, version: &str) -> Result<(), String> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => return Err(format!("cannot read the server's version '{version}'")),
    };
    let (oldest_major, oldest_minor) = OLDEST_VALKEY;
    if name != "valkey" {
        return Err(format!(
            "this is {name} {version}, not Valkey: the module supports Valkey {oldest_major}.{oldest_minor} and newer; not loading"
        ));
    }
    if (major, minor) < OLDEST_VALKEY {
        return Err(format!(
            "Valkey {version} is older than Valkey {oldest_major}.{oldest_minor}, the oldest this module supports; not loading"
        ));
    }
    Ok(())
}

/// The server's name and version from INFO server: `valkey_version` (from
/// 8.0; it keeps `redis_version` at 7.2.4), else `redis_version` and
/// `server_name` (Valkey 7.2 says valkey; Redis has none).
pub fn server_identity(ctx: Ctx) -> (String, String) {
    // SAFETY: called from OnLoad with its context; the info object is freed
    // here and the field strings are copied before that.
    unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx, c"server".as_ptr());
        if info.is_null() {
            return ("unknown".into(), String::new());
        }
        let field = |name: &CStr| -> Option<String> {
            let value = raw::RedisModule_ServerInfoGetFieldC.unwrap()(info, name.as_ptr());
            (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
        };
        let valkey = field(c"valkey_version");
        let redis = field(c"redis_version");
        let name = field(c"server_name");
        raw::RedisModule_FreeServerInfo.unwrap()(ctx, info);
        match (valkey, name) {
            (Some(version), _) => ("valkey".into(), version),
            (None, Some(name)) => (name, redis.unwrap_or_default()),
            (None, None) => ("Redis".into(), redis.unwrap_or_default()),
        }
    }
}

/// Load-time choices (module arguments).
pub struct LoadOptions {
    /// Register `CL.THROTTLE` (argument `cl-throttle yes|no`, default yes).
    pub cl_throttle: bool,
}

impl LoadOptions {
    /// Parses `name value` pairs; Err names what is wrong.
    pub fn parse(args: &[&[u8]]) -> Result<LoadOptions, String> {
        let mut options = LoadOptions { cl_throttle: true };
        let mut pairs = args.chunks(2);
        for pair in pairs.by_ref() {
            let shown = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            match pair {
                [name, value] if name.eq_ignore_ascii_case(b"cl-throttle") => {
                    options.cl_throttle = if value.eq_ignore_ascii_case(b"yes") {
                        true
                    } else if value.eq_ignore_ascii_case(b"no") {
                        false
                    } else {
                        return Err(format!(
                            "module argument cl-throttle must be yes or no, not '{}'",
                            shown(value)
                        ));
                    };
                }
                [name] => {
                    return Err(format!(
                        "module argument '{}' needs a value (cl-throttle yes|no)",
                        shown(name)
                    ))
                }
                [name, ..] => {
                    return Err(format!(
                        "unknown module argument '{}' (expected: cl-throttle yes|no)",
                        shown(name)
                    ))
                }
                [] => {}
            }
        }
        Ok(options)
    }
}

/// Registers the ACL category and every command. Err names what failed.
/// `CL.THROTTLE` is optional: when its name is taken (redis-cell is loaded)
/// it is skipped with a warning, and the rest of the module loads.
pub fn register_all(ctx: Ctx, options: &LoadOptions) -> Result<(), String> {
    // SAFETY: called once from the module's OnLoad with its context; every
    // string passed is static and NUL-terminated.
    unsafe {
        if raw::RedisModule_AddACLCategory.unwrap()(ctx, ACL_CATEGORY.as_ptr())
            != raw::Status::Ok as c_int
        {
            return Err("could not add the ACL category 'ratelimit'".into());
        }
        for spec in &COMMANDS {
            register(ctx, spec)?;
        }
    }
    if options.cl_throttle {
        if let Err(why) = register(ctx, &CL_THROTTLE) {
            let message = format!(
                "ratelimit: {why}: the name is taken (is redis-cell loaded?); CL.THROTTLE is skipped, RL.THROTTLE and RL.GCRA work as usual"
            );
            if let Ok(message) = std::ffi::CString::new(message) {
                ffi::log_warning(ctx, &message);
            }
        }
    }
    Ok(())
}

/// Creates one command with its info and ACL categories.
fn register(ctx: Ctx, spec: &Spec) -> Result<(), String> {
    // SAFETY: called from the module's OnLoad with its context; every string
    // passed is static and NUL-terminated.
    unsafe {
        let name = spec.name.to_string_lossy();
        // The legacy (first, last, step) triple cannot describe numkeys
        // commands; their key spec alone does (the server derives the rest).
        let (first, last, step) = match spec.keys {
            Keys::First => (1, 1, 1),
            Keys::Pairs => (1, -1, 2),
            Keys::Counted | Keys::Keyless => (0, 0, 0),
        };
        let created = raw::RedisModule_CreateCommand.unwrap()(
            ctx,
            spec.name.as_ptr(),
            Some(spec.entry),
            spec.flags.as_ptr(),
            first,
            last,
            step,
        );
        if created != raw::Status::Ok as c_int {
            return Err(format!("could not create {name}"));
        }
        let command = raw::RedisModule_GetCommand.unwrap()(ctx, spec.name.as_ptr());
        // Both copied by the server; dropped at the end of this call.
        let mut key_specs = key_spec(spec.key_flags, spec.keys);
        let mut args = docs::build(spec.args);
        let info = raw::RedisModuleCommandInfo {
            version: &INFO_VERSION,
            summary: spec.summary.as_ptr(),
            complexity: spec.complexity.as_ptr(),
            since: spec.since.as_ptr(),
            history: std::ptr::null_mut(),
            tips: c"nondeterministic_output".as_ptr(),
            arity: spec.arity,
            key_specs: key_specs.as_mut_ptr(),
            args: args.as_mut_ptr(),
        };
        if raw::RedisModule_SetCommandInfo.unwrap()(command, &info) != raw::Status::Ok as c_int {
            return Err(format!("could not set the command info of {name}"));
        }
        if let Some(categories) = spec.acl_categories {
            if raw::RedisModule_SetCommandACLCategories.unwrap()(command, categories.as_ptr())
                != raw::Status::Ok as c_int
            {
                return Err(format!("could not set the ACL categories of {name}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::supported;

    #[test]
    fn valkey_8_0_and_newer_load_older_servers_and_redis_do_not() {
        for ok in ["8.0.0", "8.0.1", "8.1.4", "9.1.2", "10.0.0"] {
            assert_eq!(supported("valkey", ok), Ok(()), "{ok}");
        }
        let e = supported("valkey", "7.2.4").unwrap_err();
        assert!(
            e.starts_with("Valkey 7.2.4 is older than Valkey 8.0"),
            "{e}"
        );
        let e = supported("Redis", "7.0.15").unwrap_err();
        assert!(e.starts_with("this is Redis 7.0.15, not Valkey"), "{e}");
        assert!(supported("valkey", "garbage").is_err());
    }
}
