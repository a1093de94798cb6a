//! Per-policy counters: how often each stored policy allowed, denied, would
//! have denied (shadow mode) and locked out, since it was set or its
//! counters were reset. Each definition gets an id (`stored.rs`); a call
//! that applies a policy (RL.LIMIT, RL.ALL's `POLICY name`) carries the id
//! in its options, so a waiting call (BLOCK) is counted when it is
//! answered. Kept in memory on the node that decides: a restart, a load or
//! a full sync starts every policy's counters at zero, and a replica's stay
//! at zero (it decides nothing).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::core::Millis;

/// A policy definition's identity: a new one at every RL.POLICY.SET.
pub type PolicyId = u64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub lockouts: u64,
    /// When counting began (the policy was set, loaded or reset).
    pub since: Millis,
}

/// One call's result for one policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    /// The call was answered allowed (a shadow-mode denial included).
    pub allowed: bool,
    /// The policy's own limiter denied it (answered denied, or allowed by
    /// shadow mode: then `shadow`).
    pub denied: bool,
    pub shadow: bool,
    pub locked: bool,
}

thread_local! {
    /// Each live definition's name and counters. A B-tree: its lookup of a
    /// small integer is a few comparisons, where a HashMap's SipHash of the
    /// id cost more than the rest of the counting (twice per RL.ALL of two
    /// policies).
    static STATS: RefCell<BTreeMap<PolicyId, (Vec<u8>, Stats)>> = const { RefCell::new(BTreeMap::new()) };
    static NEXT: Cell<PolicyId> = const { Cell::new(1) };
}

/// Counters for a new definition of `name`, from `now`.
pub fn register(name: &[u8], now: Millis) -> PolicyId {
    let id = NEXT.get();
    NEXT.set(id + 1);
    let stats = Stats {
        since: now,
        ..Stats::default()
    };
    STATS.with_borrow_mut(|s| s.insert(id, (name.to_vec(), stats)));
    id
}

pub fn forget(id: PolicyId) {
    STATS.with_borrow_mut(|s| s.remove(&id));
}

pub fn get(id: PolicyId) -> Option<Stats> {
    STATS.with_borrow(|s| s.get(&id).map(|(_, stats)| *stats))
}

/// Every live definition's name and counters, sorted by name.
pub fn all() -> Vec<(Vec<u8>, Stats)> {
    let mut all: Vec<(Vec<u8>, Stats)> = STATS.with_borrow(|s| s.values().cloned().collect());
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

pub fn reset(id: PolicyId, now: Millis) {
    STATS.with_borrow_mut(|s| {
        if let Some((_, stats)) = s.get_mut(&id) {
            *stats = Stats {
                since: now,
                ..Stats::default()
            };
        }
    });
}

/// Counts one call for the policy `id` (none: the call applied no stored
/// policy). A dry run asks without using anything: not counted.
pub fn record(id: Option<PolicyId>, dry_run: bool, counted: Counted) {
    let Some(id) = id.filter(|_| !dry_run) else {
        return;
    };
    STATS.with_borrow_mut(|s| {
        // A definition replaced while a call waited: counted nowhere.
        let Some((_, stats)) = s.get_mut(&id) else {
            return;
        };
        if counted.denied && !counted.shadow {
            stats.denied += 1;
        } else if counted.allowed {
            stats.allowed += 1;
        }
        if counted.denied && counted.shadow {
            stats.shadow_denied += 1;
        }
        if counted.locked {
            stats.lockouts += 1;
        }
    });
}
