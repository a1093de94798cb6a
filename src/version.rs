//! The module's version, from Cargo.toml: here, at the bottom, so that INFO
//! (shell/metrics.rs) reads it without depending on lib.rs, which registers
//! everything.

/// The release, from Cargo.toml: shown in INFO and the server log.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// "dev" between releases, "rc1".."rcN" for release candidates, "ga" once
/// released: INFO `ratelimit_release_stage`, as the official modules say it.
pub const RELEASE_STAGE: &str = "ga";

const fn number(text: &str) -> i32 {
    let digits = text.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < digits.len() {
        value = value * 10 + (digits[i] - b'0') as i32;
        i += 1;
    }
    value
}

const MAJOR: i32 = number(env!("CARGO_PKG_VERSION_MAJOR"));
const MINOR: i32 = number(env!("CARGO_PKG_VERSION_MINOR"));
const PATCH: i32 = number(env!("CARGO_PKG_VERSION_PATCH"));
const _: () = assert!(
    MINOR < 100 && PATCH < 100,
    "MAJOR*10000+MINOR*100+PATCH needs both under 100"
);

/// MAJOR*10000 + MINOR*100 + PATCH, the official modules' scheme:
/// `MODULE LIST` shows it as `ver` (1.0.0 is 10000).
pub const MODULE_VERSION: i32 = MAJOR * 10000 + MINOR * 100 + PATCH;
