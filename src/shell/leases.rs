//! The lease limiter's commands: RL.LEASE acquires (through the shared
//! read-decide-write step of `commands`), RL.RELEASE and RL.EXTEND name a
//! lease by its id. Ids are 64 bits from the operating system's random
//! source, so one client cannot name another's lease by counting.

use std::cell::RefCell;
use std::ffi::c_int;

use super::commands::{self, fail};
use super::ffi::{self, Argv, Ctx, Key, Slot, Str, Value};
use super::keytype::raw_type;
use super::{blocking, metrics, replication};
use crate::args;
use crate::core::lease::{self, LeaseId};
use crate::core::limiter::{Algorithm, Effect, Limiter};
use crate::core::policy::Policy;
use crate::core::{Millis, Outcome};

thread_local! {
    /// Random words fetched 32 at a time: one getrandom(2) call per 32 leases.
    static POOL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn random_word() -> u64 {
    POOL.with_borrow_mut(|pool| {
        if pool.is_empty() {
            let mut bytes = [0u8; 256];
            // getrandom(2) does not fail on Linux once the pool is seeded
            // (long before a server runs); should it ever, the clock keeps
            // ids unique, though guessable, rather than refusing leases.
            if getrandom::getrandom(&mut bytes).is_err() {
                let micros = ffi::now().0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                bytes[..8].copy_from_slice(&micros.to_le_bytes());
            }
            pool.extend(
                bytes
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())),
            );
        }
        pool.pop().unwrap_or_default()
    })
}

/// An id no lease in `state` holds.
pub fn fresh_id(state: Option<&Limiter>) -> LeaseId {
    let leases = match state {
        Some(Limiter::Lease(leases)) => Some(leases.as_ref()),
        _ => None,
    };
    loop {
        let id = LeaseId(random_word());
        if lease::is_free(leases, id) {
            return id;
        }
    }
}

/// RL.LEASE's reply: the five standard fields, then `lease_id` (nil when no
/// lease was granted) and `lease_ttl_ms` (0 then).
pub fn reply(ctx: Ctx, outcome: &Outcome, lease: Option<(LeaseId, Millis)>) -> c_int {
    let [a, b, c, d, e] = commands::fields(outcome).map(|(name, n)| (name, Value::Int(n)));
    let hex = lease.map(|(id, _)| id.to_hex());
    let id = match &hex {
        Some(hex) => Value::Bulk(hex),
        None => Value::Null,
    };
    let ttl = lease.map_or(0, |(_, ttl)| ttl.to_i64_saturating());
    ffi::reply_values(
        ctx,
        &[
            a,
            b,
            c,
            d,
            e,
            (c"lease_id", id),
            (c"lease_ttl_ms", Value::Int(ttl)),
        ],
    )
}

/// `RL.LEASE key limit ttl [COST n] [DRYRUN] [BLOCK timeout]`
pub fn acquire(ctx: Ctx, argv: &[Str]) -> c_int {
    match args::lease(&Argv(&argv[2..])) {
        Ok((params, options)) => {
            let policy = Policy::Lease {
                params,
                id: LeaseId(0),
            };
            commands::start(ctx, argv[1], policy, options)
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
        blocking::key_changed(ctx, argv[1]);
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
