//! valkey-ratelimit: native, atomic rate-limit commands for Valkey.
//!
//! `core` holds the algorithms (pure, no Valkey types); `args` parses
//! arguments; `shell` is the glue to the server.

pub mod args;
pub mod core;
mod shell;

use valkey_module::{valkey_module, Context, Status, ValkeyString};

use shell::datatype::RATELIMIT_TYPE;

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

fn init(ctx: &Context, args: &[ValkeyString]) -> Status {
    shell::datatype::set_module_options(ctx.ctx);
    let words: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let options = match shell::register::LoadOptions::parse(&words) {
        Ok(options) => options,
        Err(message) => {
            ctx.log_warning(&format!("ratelimit: {message}"));
            return Status::Err;
        }
    };
    match shell::register::register_all(ctx.ctx, &options) {
        Ok(()) => Status::Ok,
        Err(message) => {
            ctx.log_warning(&format!("ratelimit: {message}"));
            Status::Err
        }
    }
}

valkey_module! {
    name: "ratelimit",
    version: 100,
    allocator: (Allocator, ALLOCATOR),
    data_types: [RATELIMIT_TYPE],
    init: init,
    commands: [],
}
