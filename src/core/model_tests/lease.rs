//! Lease limiter against a naive model: a plain list of (id, expiry, cost),
//! pruned by scanning. Checked at every step: the decision, `remaining`,
//! `reset_after`, the retry time (by brute force on the model: the first
//! moment the request fits with no other change), never more than the limit
//! held, release/extend answers, the codec round trip, and a replica that
//! applies only the effects reaching the same state.

use proptest::collection::vec;
use proptest::prelude::*;

use super::{config, encoded, encoded_effect};
use crate::core::codec::{decode_effect, decode_limiter};
use crate::core::lease::{self, LeaseChange, LeaseId, LeaseParams, Leases};
use crate::core::limiter::{Effect, Limiter};
use crate::core::{Millis, RetryAfter};

#[derive(Clone, Debug)]
enum Op {
    Acquire { cost: u64, ttl: u64, limit: u64 },
    Release { pick: usize },
    Extend { pick: usize, ttl: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..=5u64, 1..=3000u64, 1..=6u64).prop_map(|(cost, ttl, limit)| Op::Acquire { cost, ttl, limit }),
        2 => (0..8usize).prop_map(|pick| Op::Release { pick }),
        2 => (0..8usize, 1..=3000u64).prop_map(|(pick, ttl)| Op::Extend { pick, ttl }),
    ]
}

/// The model: leases as granted, the clock as the code sees it (never back).
struct Model {
    leases: Vec<(u64, u64, u64)>,
    last: u64,
}

impl Model {
    fn live(&self, at: u64) -> Vec<(u64, u64, u64)> {
        self.leases.iter().copied().filter(|l| l.1 > at).collect()
    }
    fn in_use(&self, at: u64) -> u64 {
        self.live(at).iter().map(|l| l.2).sum()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn lease_limiter_matches_model(
        start in 0..10_000u64,
        ops in vec(((-500..2000i64), op()), 1..60),
    ) {
        let mut model = Model { leases: Vec::new(), last: 0 };
        let mut state: Option<Leases> = None;
        let mut replica: Option<Leases> = None;
        let mut now = start;
        let mut next_id = 1u64;
        for (dt, op) in ops {
            now = now.saturating_add_signed(dt);
            let at = now.max(model.last);
            let change = match op {
                Op::Acquire { cost, ttl, limit } => {
                    let params = LeaseParams { limit, ttl: Millis(ttl) };
                    let (outcome, granted) = lease::decide(state.as_ref(), params, Millis(now), cost);
                    let in_use = model.in_use(at);
                    let fits = cost == 0 || in_use + cost <= limit;
                    prop_assert_eq!(outcome.allowed, fits);
                    prop_assert_eq!(granted.is_some(), fits && cost > 0);
                    let after = in_use + if granted.is_some() { cost } else { 0 };
                    prop_assert_eq!(outcome.remaining, limit.saturating_sub(after));
                    let mut ends: Vec<u64> = model.live(at).iter().map(|l| l.1).collect();
                    if granted.is_some() {
                        ends.push(at + ttl);
                    }
                    let reset = ends.iter().max().map_or(0, |end| end - now);
                    prop_assert_eq!(outcome.reset_after, Millis(reset));
                    if !fits {
                        if cost > limit {
                            prop_assert_eq!(outcome.retry_after, RetryAfter::Never);
                        } else {
                            // The first model time it fits, with no other change.
                            let mut first = at;
                            while model.in_use(first) + cost > limit {
                                first += 1;
                            }
                            prop_assert_eq!(outcome.retry_after, RetryAfter::After(Millis(first - now)));
                        }
                    }
                    granted.map(|(at, l)| {
                        let id = LeaseId(next_id);
                        next_id += 1;
                        model.leases.push((id.0, at.0 + ttl, cost));
                        lease::grant(params, at, l, id)
                    })
                }
                Op::Release { pick } => {
                    let id = model.leases.get(pick).map_or(999, |l| l.0);
                    let held = model.live(at).iter().any(|l| l.0 == id);
                    let change = state.as_ref().and_then(|s| lease::release(s, LeaseId(id), Millis(now)));
                    prop_assert_eq!(change.is_some(), held);
                    if held {
                        model.leases.retain(|l| l.0 != id);
                    }
                    change
                }
                Op::Extend { pick, ttl } => {
                    let id = model.leases.get(pick).map_or(999, |l| l.0);
                    let held = model.live(at).iter().any(|l| l.0 == id);
                    let change = state.as_ref().and_then(|s| lease::extend(s, LeaseId(id), Millis(ttl), Millis(now)));
                    prop_assert_eq!(change.is_some(), held);
                    if held {
                        for l in model.leases.iter_mut().filter(|l| l.0 == id) {
                            l.1 = at + ttl;
                        }
                    }
                    change
                }
            };
            if let Some(change) = change {
                model.last = at;
                for copy in [&mut state, &mut replica] {
                    copy.get_or_insert_with(|| Leases::new(1)).apply(change);
                }
                let effect = Effect::Lease(change);
                prop_assert_eq!(decode_effect(&encoded_effect(&effect)), Some(effect));
                if let LeaseChange::Grant { limit, .. } = change {
                    prop_assert!(model.in_use(at) <= limit);
                }
            }
            if let Some(s) = &state {
                prop_assert_eq!(s.in_use(Millis(at)), model.in_use(at));
                prop_assert_eq!(Some(s), replica.as_ref());
                let limiter = Limiter::Lease(Box::new(s.clone()));
                prop_assert_eq!(decode_limiter(&encoded(&limiter)), Some(limiter));
            }
        }
    }
}
