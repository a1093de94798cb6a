//! Argument lists for `COMMAND DOCS`: what valkey-cli's hints and client
//! generators read. One tree per command, turned into the server's
//! `RedisModuleCommandArg` arrays once, at load.

use std::ffi::CStr;

use valkey_module::raw;

#[derive(Clone, Copy)]
enum Kind {
    Key,
    Integer,
    Text,
    Token,
    OneOf,
    Block,
}

/// One documented argument.
pub struct Arg {
    name: &'static CStr,
    kind: Kind,
    token: Option<&'static CStr>,
    flags: u32,
    sub: &'static [Arg],
}

const OPTIONAL: u32 = raw::REDISMODULE_CMD_ARG_OPTIONAL;
const MULTIPLE: u32 = raw::REDISMODULE_CMD_ARG_MULTIPLE;

const fn arg(name: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        flags: 0,
        sub: &[],
    }
}

const fn key() -> Arg {
    arg(c"key", Kind::Key)
}
const fn int(name: &'static CStr) -> Arg {
    arg(name, Kind::Integer)
}
/// A duration: an integer with an optional unit (ms, s, m, h, d).
const fn duration(name: &'static CStr) -> Arg {
    arg(name, Kind::Text)
}
/// An optional flag such as `DRYRUN`.
const fn flag(name: &'static CStr, token: &'static CStr) -> Arg {
    Arg {
        token: Some(token),
        flags: OPTIONAL,
        ..arg(name, Kind::Token)
    }
}
/// An optional `TOKEN value`.
const fn option(token: &'static CStr, value: Arg) -> Arg {
    Arg {
        token: Some(token),
        flags: OPTIONAL,
        ..value
    }
}
const fn block(name: &'static CStr, token: &'static CStr, sub: &'static [Arg]) -> Arg {
    Arg {
        token: Some(token),
        sub,
        ..arg(name, Kind::Block)
    }
}

/// The positional arguments, the options every limiter command takes, then
/// any options of its own.
macro_rules! with_options {
    ($($arg:expr),* $(,)? ; $($extra:expr),*) => {
        &[
            $($arg,)*
            option(c"COST", int(c"cost")),
            flag(c"dryrun", c"DRYRUN"),
            flag(c"partial", c"PARTIAL"),
            option(c"LOCKOUT", duration(c"duration")),
            flag(c"brief", c"BRIEF"),
            $($extra,)*
        ]
    };
    ($($arg:expr),* $(,)?) => { with_options![$($arg),* ;] };
}

/// The options plus BLOCK: the single-limiter commands.
macro_rules! with_block_options {
    ($($arg:expr),* $(,)?) => {
        with_options![$($arg),* ; option(c"BLOCK", duration(c"timeout"))]
    };
}

pub const TOKEN_BUCKET: &[Arg] = with_block_options![
    key(),
    int(c"capacity"),
    int(c"refill_amount"),
    duration(c"refill_period"),
];
/// A calendar window's zone and anchor: after a period of `day`, `week`,
/// `month` or `year` instead of a duration.
const ZONE: Arg = option(c"TZ", arg(c"zone", Kind::Text));
const ANCHOR: Arg = option(c"ANCHOR", arg(c"anchor", Kind::Text));
pub const WINDOW: &[Arg] = with_block_options![
    key(),
    int(c"limit"),
    duration(c"period"),
    ZONE,
    ANCHOR,
    flag(c"sliding", c"SLIDING"),
];
pub const SLIDING_LOG: &[Arg] = with_block_options![
    key(),
    int(c"limit"),
    duration(c"period"),
    flag(c"countdenied", c"COUNTDENIED"),
];
pub const TOP_DENIED: &[Arg] = &[Arg {
    flags: OPTIONAL,
    ..int(c"count")
}];
pub const GCRA: &[Arg] =
    with_block_options![key(), int(c"burst"), int(c"rate"), duration(c"period")];
pub const THROTTLE: &[Arg] = &[
    key(),
    int(c"max_burst"),
    int(c"count_per_period"),
    duration(c"period"),
    Arg {
        flags: OPTIONAL,
        ..int(c"quantity")
    },
];
const TOKENBUCKET_BLOCK: Arg = block(
    c"tokenbucket",
    c"TOKENBUCKET",
    &[
        int(c"capacity"),
        int(c"refill_amount"),
        duration(c"refill_period"),
    ],
);
const WINDOW_BLOCK: Arg = block(
    c"window",
    c"WINDOW",
    &[
        int(c"limit"),
        duration(c"period"),
        ZONE,
        ANCHOR,
        flag(c"sliding", c"SLIDING"),
    ],
);
const SLIDINGLOG_BLOCK: Arg = block(
    c"slidinglog",
    c"SLIDINGLOG",
    &[
        int(c"limit"),
        duration(c"period"),
        flag(c"countdenied", c"COUNTDENIED"),
    ],
);
const GCRA_BLOCK: Arg = block(
    c"gcra",
    c"GCRA",
    &[int(c"burst"), int(c"rate"), duration(c"period")],
);
/// One limiter as RL.POLICY.SET takes it.
const LIMITER: Arg = Arg {
    sub: &[
        TOKENBUCKET_BLOCK,
        WINDOW_BLOCK,
        SLIDINGLOG_BLOCK,
        GCRA_BLOCK,
    ],
    ..arg(c"limiter", Kind::OneOf)
};
/// RL.ALL's: those, or a stored policy by name.
const ALL_LIMITER: Arg = Arg {
    sub: &[
        TOKENBUCKET_BLOCK,
        WINDOW_BLOCK,
        SLIDINGLOG_BLOCK,
        GCRA_BLOCK,
        block(c"policy", c"POLICY", &[arg(c"name", Kind::Text)]),
    ],
    ..arg(c"limiter", Kind::OneOf)
};
pub const ALL: &[Arg] = with_options![
    int(c"numkeys"),
    Arg {
        flags: MULTIPLE,
        ..key()
    },
    Arg {
        flags: MULTIPLE,
        ..ALL_LIMITER
    },
];
pub const LIMIT: &[Arg] = with_block_options![key(), arg(c"policy", Kind::Text)];
pub const POLICY_NAME: &[Arg] = &[arg(c"name", Kind::Text)];
pub const POLICY_NAMES: &[Arg] = &[Arg {
    flags: MULTIPLE,
    ..arg(c"name", Kind::Text)
}];
pub const POLICY_NAMES_OPTIONAL: &[Arg] = &[Arg {
    flags: MULTIPLE | OPTIONAL,
    ..arg(c"name", Kind::Text)
}];
pub const POLICY_SET: &[Arg] = &[arg(c"name", Kind::Text), LIMITER, flag(c"brief", c"BRIEF")];
pub const LEASE: &[Arg] = &[
    key(),
    int(c"limit"),
    duration(c"ttl"),
    option(c"COST", int(c"cost")),
    flag(c"dryrun", c"DRYRUN"),
    option(c"BLOCK", duration(c"timeout")),
];
pub const RELEASE: &[Arg] = &[key(), arg(c"lease_id", Kind::Text)];
pub const EXTEND: &[Arg] = &[key(), arg(c"lease_id", Kind::Text), duration(c"ttl")];
pub const REFUND: &[Arg] = &[key(), int(c"amount")];
pub const KEY_ONLY: &[Arg] = &[key()];
/// As MSET's `data`: one or more key and effect pairs.
pub const APPLY: &[Arg] = &[Arg {
    flags: MULTIPLE,
    sub: &[key(), arg(c"effect", Kind::Text)],
    ..arg(c"data", Kind::Block)
}];

/// The server's array for a list of arguments, with its zeroed terminator,
/// and the arrays of their sub-arguments, which it points into. Owned:
/// `RedisModule_SetCommandInfo` copies it all, so it is freed afterwards
/// (leaking it was found by make memcheck).
pub struct Built {
    entries: Vec<raw::RedisModuleCommandArg>,
    /// Moving a Vec keeps its buffer where it is, so the pointers into
    /// these stay valid as long as `Built` lives.
    _children: Vec<Built>,
}

impl Built {
    /// The array for the server; null for a command without arguments.
    pub fn as_mut_ptr(&mut self) -> *mut raw::RedisModuleCommandArg {
        if self.entries.len() <= 1 {
            std::ptr::null_mut()
        } else {
            self.entries.as_mut_ptr()
        }
    }
}

pub fn build(args: &[Arg]) -> Built {
    // SAFETY: an all-zero argument is the documented array terminator.
    let terminator: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
    let mut children = Vec::new();
    let mut entries: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            let mut entry = terminator;
            entry.name = a.name.as_ptr();
            entry.type_ = match a.kind {
                Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                Kind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                Kind::Text => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                Kind::Token => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                Kind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Kind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            // Every command has one key spec (index 0); other arguments -1.
            entry.key_spec_index = if matches!(a.kind, Kind::Key) { 0 } else { -1 };
            entry.token = a.token.map_or(std::ptr::null(), CStr::as_ptr);
            entry.flags = a.flags as i32;
            if !a.sub.is_empty() {
                let mut sub = build(a.sub);
                entry.subargs = sub.as_mut_ptr();
                children.push(sub);
            }
            entry
        })
        .collect();
    entries.push(terminator);
    Built {
        entries,
        _children: children,
    }
}
