//! The `ratelimit` type as key access sees it: the handle the server gave it
//! at load, to tell our keys from others', and the name and encoding version
//! written into every RDB file. Below every file that opens a key; the type
//! itself, with its callbacks, is registered at the top (datatype.rs), which
//! hands its handle down here once the server has created it.
//!
//! Never rename the type; bump the version only with a loader for the old one.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use valkey_module::raw;

pub const TYPE_NAME: &str = "ratelimit";
pub const ENCODING_VERSION: i32 = 1;

/// Set once at load, before any command is registered (lib.rs `init`).
static RAW_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

/// The registered type.
pub fn raw_type() -> *mut raw::RedisModuleType {
    RAW_TYPE.load(Ordering::Relaxed)
}

/// Keeps the handle the server gave the type (datatype.rs, at load).
pub fn set_raw_type(handle: *mut raw::RedisModuleType) {
    RAW_TYPE.store(handle, Ordering::Relaxed);
}
