//! The lease limiter's commands: RL.LEASE acquires (through the pipeline,
//! commands.rs, which gives the lease its id: lease_ids.rs), RL.RELEASE and
//! RL.EXTEND name a lease by its id.

use std::ffi::c_int;

use super::commands::fail;
use super::ffi::{self, Argv, Ctx, Key, Slot, Str};
use super::keytype::raw_type;
use super::{limiters, metrics, replication, waiters};
use crate::args;
use crate::core::lease::{self, LeaseId};
use crate::core::limiter::{Algorithm, Effect, Limiter};
use crate::core::policy::Policy;
use crate::core::Millis;

/// `RL.LEASE key limit ttl [COST n] [DRYRUN] [BLOCK timeout]`
pub fn acquire(ctx: Ctx, argv: &[Str]) -> c_int {
    match args::lease(&Argv(&argv[2..])) {
        Ok((params, options)) => {
            let policy = Policy::Lease {
                params,
                id: LeaseId(0),
            };
            limiters::start(ctx, argv[1], policy, options)
        }
        Err(error) => fail(ctx, &error.0),
    }
}

/// The lease named in argv[2] of the lease limiter at argv[1], and what
/// `change` makes of it. Replies 1 when the lease was held (and is changed),
/// 0 when no such lease is held (never granted, released, or expired).
fn change_lease(
    ctx: Ctx,
    argv: &[Str],
    released: bool,
    change: impl FnOnce(&lease::Leases, LeaseId, Millis) -> Option<lease::LeaseChange>,
) -> c_int {
    let id = match args::lease_id(ffi::bytes(argv[2])) {
        Ok(id) => id,
        Err(error) => return fail(ctx, &error.0),
    };
    let Some(mut key) = Key::open(ctx, argv[1], true) else {
        return fail(ctx, "ERR could not open the key for writing");
    };
    let now = ffi::now();
    let effect = match key.get::<Limiter>(raw_type()) {
        Slot::Empty => None,
        Slot::Foreign => return fail(ctx, replication::WRONGTYPE),
        Slot::Ours(Limiter::Lease(leases)) => change(leases, id, now),
        Slot::Ours(other) => {
            let message = format!(
                "WRONGTYPE key holds {}, not {}",
                other.algorithm().description(),
                Algorithm::Lease.description()
            );
            return fail(ctx, &message);
        }
    };
    let Some(effect) = effect else {
        return ffi::reply_integer(ctx, 0);
    };
    if let Err(message) = replication::commit(ctx, &mut key, argv[1], Effect::Lease(effect)) {
        return fail(ctx, message);
    }
    metrics::record_lease_change(released);
    if released {
        waiters::key_changed(ctx, argv[1]);
    }
    ffi::reply_integer(ctx, 1)
}

/// `RL.RELEASE key lease_id`: 1 when the lease was held and its slots are
/// free now, 0 when no such lease is held.
pub fn release(ctx: Ctx, argv: &[Str]) -> c_int {
    change_lease(ctx, argv, true, lease::release)
}

/// `RL.EXTEND key lease_id ttl`: the lease is held until now + ttl; 1 when
/// it was held, 0 when not (an expired lease is not revived).
pub fn extend(ctx: Ctx, argv: &[Str]) -> c_int {
    let ttl = match args::lease_ttl(ffi::bytes(argv[3])) {
        Ok(ttl) => ttl,
        Err(error) => return fail(ctx, &error.0),
    };
    change_lease(ctx, argv, false, |leases, id, now| {
        lease::extend(leases, id, ttl, now)
    })
}
