//! The Valkey glue: thin, and each concern in one file.
//!
//! The files are layered: a file uses only files of the layers below its
//! own and those listed before it in its own layer, never one above, so no
//! two files depend on each other, directly or through others
//! (tests/layering.rs fails when a circle comes back, or when a file uses
//! one listed after it here). Bottom to top:
//!
//! 1. **Server access**: `ffi` (each raw module API call wrapped once: keys,
//!    replies, the clock), `keytype` (the registered type's handle, its name
//!    and encoding version), `docs` (COMMAND DOCS argument lists).
//! 2. **Node state and signals**, what a command reads or tells on its way:
//!    `policy_stats` (per-policy counters), `propagation` (whether effects
//!    are built), `metrics` (INFO counters), `denied_report` (RL.TOPDENIED),
//!    `controls` (configs, keyspace events, shadow mode), `waiters` (the
//!    per-key queues of BLOCK waiters, their wake-up timers, and the signal
//!    a change sends them), `lease_ids` (random lease ids).
//! 3. **The command pipeline**, parse -> decide -> commit -> reply:
//!    `replication` (commit: apply the effect, propagate it, signal the
//!    key's waiters; RL.APPLY), `commands` (read the key, let the core
//!    decide, commit, reply: `execute` and `run_policy`).
//! 4. **The features that wrap it**: `blocking` (BLOCK: a denied call waits,
//!    its attempts run through the pipeline), `limiters` (the single-limiter
//!    commands, at once or waiting; RL.REFUND, RL.UNLOCK, RL.PEEK,
//!    RL.INSPECT), `leases` (RL.LEASE, RL.RELEASE, RL.EXTEND),
//!    `stored` (stored policies, RL.LIMIT), `compound` (RL.ALL).
//! 5. **Registration**: `events` (server events handed to the files that
//!    need them), `datatype` (the data type with its callbacks, the stored
//!    policies' aux data among them), `register` (the command table); lib.rs
//!    (`valkey_module!`, load) above them all.
//!
//! Below the shell: `crate::args` (argument parsing), `crate::core` (the
//! algorithms) and `crate::version`; none of them knows the shell.

pub mod blocking;
pub mod commands;
pub mod compound;
pub mod controls;
pub mod datatype;
pub mod denied_report;
mod docs;
pub mod events;
pub mod ffi;
pub mod keytype;
pub mod lease_ids;
pub mod leases;
pub mod limiters;
pub mod metrics;
pub mod policy_stats;
pub mod propagation;
pub mod register;
pub mod replication;
pub mod stored;
pub mod waiters;
