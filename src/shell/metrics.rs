//! Counters for INFO (section `ratelimit_stats`). Commands run on the main
//! thread; atomics only make the statics safe to share.

use std::sync::atomic::{AtomicU64, Ordering};

use valkey_module::{InfoContext, ValkeyResult};
use valkey_module_macros::info_command_handler;

use super::policy_stats;
use crate::core::limiter::Algorithm;

pub struct Counters {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
}

const fn counters() -> Counters {
    Counters {
        allowed: AtomicU64::new(0),
        denied: AtomicU64::new(0),
    }
}

static TOKEN_BUCKET: Counters = counters();
static FIXED_WINDOW: Counters = counters();
static SLIDING_WINDOW: Counters = counters();
static SLIDING_LOG: Counters = counters();
static GCRA: Counters = counters();
static LEASE: Counters = counters();
static CALENDAR_WINDOW: Counters = counters();
static ALL: Counters = counters();
static ERRORS: AtomicU64 = AtomicU64::new(0);
static SHADOW_DENIED: AtomicU64 = AtomicU64::new(0);
static LOCKOUTS: AtomicU64 = AtomicU64::new(0);
static UNLOCKS: AtomicU64 = AtomicU64::new(0);
static REFUNDS: AtomicU64 = AtomicU64::new(0);
static REFUNDED: AtomicU64 = AtomicU64::new(0);
static RELEASES: AtomicU64 = AtomicU64::new(0);
static EXTENDS: AtomicU64 = AtomicU64::new(0);
static BLOCKED: AtomicU64 = AtomicU64::new(0);
static BLOCKS: AtomicU64 = AtomicU64::new(0);
static BLOCK_TIMEOUTS: AtomicU64 = AtomicU64::new(0);

fn of(algorithm: Algorithm) -> &'static Counters {
    match algorithm {
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::SlidingWindow => &SLIDING_WINDOW,
        Algorithm::SlidingLog => &SLIDING_LOG,
        Algorithm::Gcra => &GCRA,
        Algorithm::Lease => &LEASE,
        Algorithm::CalendarWindow => &CALENDAR_WINDOW,
    }
}

pub fn record(algorithm: Algorithm, allowed: bool) {
    let counters = of(algorithm);
    let counter = if allowed {
        &counters.allowed
    } else {
        &counters.denied
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// RL.ALL calls, counted once each (not once per limiter).
pub fn record_all(allowed: bool) {
    let counter = if allowed { &ALL.allowed } else { &ALL.denied };
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn record_error() {
    ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// A request answered allowed only because shadow mode is on.
pub fn record_shadow_denied() {
    SHADOW_DENIED.fetch_add(1, Ordering::Relaxed);
}

/// A key locked out by LOCKOUT.
pub fn record_lockout() {
    LOCKOUTS.fetch_add(1, Ordering::Relaxed);
}

/// A lock lifted by RL.UNLOCK.
pub fn record_unlock() {
    UNLOCKS.fetch_add(1, Ordering::Relaxed);
}

/// An RL.REFUND call on a limiter, and the units it gave back.
pub fn record_refund(units: u64) {
    REFUNDS.fetch_add(1, Ordering::Relaxed);
    REFUNDED.fetch_add(units, Ordering::Relaxed);
}

/// An RL.RELEASE (`released`) or RL.EXTEND (`!released`) that found its lease.
pub fn record_lease_change(released: bool) {
    let counter = if released { &RELEASES } else { &EXTENDS };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A client starts waiting (BLOCK).
pub fn record_block() {
    BLOCKS.fetch_add(1, Ordering::Relaxed);
    BLOCKED.fetch_add(1, Ordering::Relaxed);
}

/// A waiting client is answered or gone; `timed_out` when its time ran out.
pub fn record_unblock(timed_out: bool) {
    BLOCKED.fetch_sub(1, Ordering::Relaxed);
    if timed_out {
        BLOCK_TIMEOUTS.fetch_add(1, Ordering::Relaxed);
    }
}

#[info_command_handler]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> ValkeyResult<()> {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed).to_string();
    // `# ratelimit_module`: which release is loaded.
    let builder = ctx
        .builder()
        .add_section("module")
        .field("version", crate::version::VERSION.to_string())?
        .field("ver", crate::version::MODULE_VERSION.to_string())?
        .field("release_stage", crate::version::RELEASE_STAGE.to_string())?
        .build_section()?;
    let mut section = builder.add_section("stats");
    for (name, algorithm) in [
        ("tokenbucket", Algorithm::TokenBucket),
        ("window", Algorithm::FixedWindow),
        ("sliding_window", Algorithm::SlidingWindow),
        ("slidinglog", Algorithm::SlidingLog),
        ("gcra", Algorithm::Gcra),
        ("lease", Algorithm::Lease),
        ("calendar_window", Algorithm::CalendarWindow),
    ] {
        let counters = of(algorithm);
        section = section
            .field(&format!("{name}_allowed"), get(&counters.allowed))?
            .field(&format!("{name}_denied"), get(&counters.denied))?;
    }
    let builder = section
        .field("all_allowed", get(&ALL.allowed))?
        .field("all_denied", get(&ALL.denied))?
        .field("shadow_denied", get(&SHADOW_DENIED))?
        .field("lockouts", get(&LOCKOUTS))?
        .field("unlocks", get(&UNLOCKS))?
        .field("refunds", get(&REFUNDS))?
        .field("refunded", get(&REFUNDED))?
        .field("releases", get(&RELEASES))?
        .field("extends", get(&EXTENDS))?
        .field("blocked_clients", get(&BLOCKED))?
        .field("blocks", get(&BLOCKS))?
        .field("block_timeouts", get(&BLOCK_TIMEOUTS))?
        .field("errors", get(&ERRORS))?
        .field(
            "propagating",
            u64::from(super::propagation::is_on()).to_string(),
        )?
        .build_section()?;
    let mut policies = builder.add_section("policies");
    let all = policy_stats::all();
    let shown = |name: &[u8]| {
        name.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(b))
    };
    let mut listed = 0;
    for (name, stats) in &all {
        if listed == MAX_INFO_POLICIES || !shown(name) {
            continue;
        }
        listed += 1;
        let value = format!(
            "allowed={},denied={},shadow_denied={},lockouts={},since_ms={}",
            stats.allowed, stats.denied, stats.shadow_denied, stats.lockouts, stats.since.0
        );
        let name = String::from_utf8_lossy(name);
        policies = policies.field(&format!("policy_{name}"), value)?;
    }
    policies
        .field("policies_not_shown", (all.len() - listed).to_string())?
        .build_section()?
        .build_info()?;
    Ok(())
}

/// INFO lists at most this many policies (RL.POLICY.STATS lists them all).
const MAX_INFO_POLICIES: usize = 100;
