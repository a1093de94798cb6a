//! Lease ids: 64 bits from the operating system's random source, so one
//! client cannot name another's lease by counting. Below the pipeline
//! (commands.rs), which gives a granted lease its id.

use std::cell::RefCell;

use super::ffi;
use crate::core::lease::{self, LeaseId};
use crate::core::limiter::Limiter;

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
