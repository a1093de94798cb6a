//! valkey-ratelimit: native, atomic rate-limit commands for Valkey.
//!
//! `core` holds the algorithms (pure, no Valkey types); `args` parses
//! arguments; `shell` is the glue to the server.
//!
//! Layered, bottom to top: `version` and `core`, then `args` (parses into
//! the core's types), then `shell` (its own layers are in shell/mod.rs),
//! then this file, which registers it all. No file uses one above it, so
//! none depends on itself through others (tests/layering.rs).

pub mod args;
pub mod core;
mod shell;
mod version;

use valkey_module::configuration::ConfigurationFlags;
use valkey_module::{valkey_module, Context, Status, ValkeyString};

use shell::datatype::RATELIMIT_TYPE;
use shell::{controls, denied_report};
pub use version::{MODULE_VERSION, RELEASE_STAGE, VERSION};

// Inside the server every allocation goes through Valkey's allocator (so
// MEMORY USAGE and used_memory see it); unit tests run without a server.
#[cfg(not(test))]
type Allocator = valkey_module::alloc::ValkeyAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = valkey_module::alloc::ValkeyAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

fn load_options(ctx: &Context, args: &[ValkeyString]) -> Option<shell::register::LoadOptions> {
    let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    match shell::register::LoadOptions::parse(&words) {
        Ok(options) => Some(options),
        Err(message) => {
            ctx.log_warning(&format!("ratelimit: {message}"));
            None
        }
    }
}

/// Runs before the data type and the configs are created: a refused load
/// then leaves nothing of them behind (found by make memcheck). A server
/// this module does not support is refused first, saying why.
fn preload(ctx: &Context, args: &[ValkeyString]) -> Status {
    let (name, version) = shell::register::server_identity(ctx.ctx);
    if let Err(why) = shell::register::supported(&name, &version) {
        ctx.log_warning(&format!("ratelimit {VERSION}: {why}"));
        return Status::Err;
    }
    match load_options(ctx, args) {
        Some(_) => Status::Ok,
        None => Status::Err,
    }
}

fn init(ctx: &Context, args: &[ValkeyString]) -> Status {
    shell::datatype::init(ctx.ctx);
    shell::waiters::init(ctx.ctx);
    let Some(options) = load_options(ctx, args) else {
        return Status::Err;
    };
    match shell::register::register_all(ctx.ctx, &options) {
        Ok(()) => {
            if shell::events::init(ctx.ctx) {
                shell::propagation::init(ctx.ctx);
            }
            Status::Ok
        }
        Err(message) => {
            ctx.log_warning(&format!("ratelimit: {message}"));
            Status::Err
        }
    }
}

valkey_module! {
    name: "ratelimit",
    version: MODULE_VERSION,
    allocator: (Allocator, ALLOCATOR),
    data_types: [RATELIMIT_TYPE],
    preload: preload,
    init: init,
    commands: [],
    // `ratelimit.<name>`: CONFIG GET/SET, valkey.conf, CONFIG REWRITE.
    configurations: [
        i64: [
            ["max-limiters", &controls::MAX_LIMITERS, args::DEFAULT_MAX_LIMITERS as i64, 1, controls::MAX_LIMITERS_BOUND, ConfigurationFlags::DEFAULT, None],
            ["denied-report-size", &denied_report::SIZE, denied_report::DEFAULT_SIZE, 0, denied_report::MAX_SIZE, ConfigurationFlags::DEFAULT, None],
            ["denied-report-interval", &denied_report::INTERVAL, denied_report::DEFAULT_INTERVAL, 1, denied_report::MAX_INTERVAL, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["events", &controls::EVENTS, false, ConfigurationFlags::DEFAULT, None],
            ["shadow-mode", &controls::SHADOW, false, ConfigurationFlags::DEFAULT, None],
            ["always-propagate", &shell::propagation::ALWAYS, false, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        // Load arguments stay `cl-throttle yes|no` (register.rs).
        module_args_as_configuration: false,
    ]
}
