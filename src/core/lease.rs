//! Lease limiter: at most `limit` slots held at once. A request takes `cost`
//! slots for `ttl`; the holder gives them back by id (release), keeps them
//! with a heartbeat (extend), or loses them when the TTL passes, so a holder
//! that crashed never leaks capacity.
//!
//! The state is the list of live leases, ordered by expiry (then id): the
//! retry time is a walk from the earliest. Every lease holds at least one
//! slot, so a limiter never holds more than `MAX_LEASE_LIMIT` leases.
//! Changes are small records (a grant, a release, an extension) that carry
//! their time: applying one first drops what had expired by then, so every
//! copy reaches the same state without a clock.

use super::bounds::{self, clock};
use super::{until, Millis, Outcome, RetryAfter};

/// The largest `limit` of a lease limiter: bounds a key's memory (24 to 27 bytes
/// a lease) and the O(leases) walks of a call.
pub const MAX_LEASE_LIMIT: u64 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseParams {
    pub limit: u64,
    pub ttl: Millis,
}

/// A lease id: 64 random bits chosen by the primary (see shell), shown to
/// clients as 16 hexadecimal digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseId(pub u64);

impl LeaseId {
    pub fn to_hex(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            let nibble = (self.0 >> (60 - 4 * i)) & 0xf;
            *byte = b"0123456789abcdef"[nibble as usize];
        }
        out
    }

    /// Exactly 16 hexadecimal digits, either case.
    pub fn from_hex(text: &[u8]) -> Option<LeaseId> {
        if text.len() != 16 {
            return None;
        }
        let mut value = 0u64;
        for &byte in text {
            let digit = (byte as char).to_digit(16)?;
            value = (value << 4) | u64::from(digit);
        }
        Some(LeaseId(value))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub expires_at: Millis,
    pub cost: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leases {
    pub limit: u64,
    /// The latest time a change was made at: a clock that goes back is
    /// treated as standing still here, so no lease ends early.
    last: Millis,
    /// Ordered by (expires_at, id); may include leases expired since `last`.
    held: Vec<Lease>,
}

/// One change to a lease limiter, as replication and the AOF carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseChange {
    Grant {
        limit: u64,
        at: Millis,
        lease: Lease,
    },
    Release {
        at: Millis,
        id: LeaseId,
    },
    Extend {
        at: Millis,
        id: LeaseId,
        expires_at: Millis,
    },
}

impl LeaseChange {
    pub fn at(&self) -> Millis {
        match self {
            LeaseChange::Grant { at, .. }
            | LeaseChange::Release { at, .. }
            | LeaseChange::Extend { at, .. } => *at,
        }
    }
}

impl Leases {
    pub fn new(limit: u64) -> Leases {
        Leases {
            limit,
            last: Millis::ZERO,
            held: Vec::new(),
        }
    }

    pub fn last_update(&self) -> Millis {
        self.last
    }

    pub fn held(&self) -> &[Lease] {
        &self.held
    }

    pub fn heap_capacity(&self) -> usize {
        self.held.capacity() * std::mem::size_of::<Lease>()
    }

    /// A state loaded from outside (RDB, RESTORE) is accepted only when this
    /// code could have produced it: leases in order, ids unique, each holding
    /// at least one slot, no more slots in all than the limit (a grant must
    /// fit, and a lowered limit is stored only by a grant that fits under
    /// it), each live at the last change and ending at most the longest TTL
    /// after it (every grant and extension is made at the last change).
    pub fn restored(limit: u64, last: Millis, mut held: Vec<Lease>) -> Option<Leases> {
        // Loaded by pushes (RDB, RESTORE): no spare room kept.
        held.shrink_to_fit();
        let in_order = held
            .windows(2)
            .all(|p| (p[0].expires_at, p[0].id) < (p[1].expires_at, p[1].id));
        let mut ids: Vec<LeaseId> = held.iter().map(|l| l.id).collect();
        ids.sort_unstable();
        ids.dedup();
        let total = held.iter().try_fold(0u64, |sum, l| {
            (l.cost >= 1).then(|| sum.checked_add(l.cost))?
        });
        let fits = total.is_some_and(|t| t <= limit);
        let live = held
            .iter()
            .all(|l| bounds::is_deadline_after(last, l.expires_at));
        ((1..=MAX_LEASE_LIMIT).contains(&limit)
            && bounds::is_anchor(last)
            && in_order
            && ids.len() == held.len()
            && fits
            && live)
            .then_some(Leases { limit, last, held })
    }

    /// A state an earlier version loaded and this one refuses, brought
    /// within the bounds: a lease ending later than the longest TTL after
    /// the last change ends then, and the limit is raised to the slots held
    /// (the next grant stores its own limit). None when even that does not
    /// make it valid.
    pub fn repaired(limit: u64, last: Millis, held: Vec<Lease>) -> Option<Leases> {
        let latest = last.saturating_add(bounds::MAX_PERIOD);
        let mut held: Vec<Lease> = held
            .into_iter()
            .map(|l| Lease {
                expires_at: l.expires_at.min(latest),
                ..l
            })
            .collect();
        held.sort_by_key(|l| (l.expires_at, l.id));
        let total = held
            .iter()
            .try_fold(0u64, |sum, l| sum.checked_add(l.cost))?;
        Leases::restored(limit.max(total), last, held)
    }

    /// When the last lease ends: the key expires then.
    pub fn empty_at(&self) -> Millis {
        self.held
            .iter()
            .map(|l| l.expires_at)
            .max()
            .unwrap_or(self.last)
    }

    /// The leases still held at `at` (those ending later).
    fn live(&self, at: Millis) -> &[Lease] {
        let first = self.held.partition_point(|l| l.expires_at <= at);
        &self.held[first..]
    }

    fn find(&self, id: LeaseId, at: Millis) -> Option<&Lease> {
        self.live(at).iter().find(|l| l.id == id)
    }

    pub fn in_use(&self, at: Millis) -> u64 {
        self.live(at).iter().map(|l| l.cost).sum()
    }

    fn insert(&mut self, lease: Lease) {
        let position = self
            .held
            .partition_point(|l| (l.expires_at, l.id) < (lease.expires_at, lease.id));
        // Grow by an eighth, not double: a key holds at most 1/8 spare
        // (27 bytes a lease, not up to 48); the copy is O(leases), as the
        // insert is already.
        if self.held.len() == self.held.capacity() {
            self.held.reserve_exact((self.held.len() / 8).max(4));
        }
        self.held.insert(position, lease);
    }

    /// Whether `change` can apply: a grant must fit beside the leases held
    /// at its time (true of every grant `decide` makes; an RL.APPLY payload
    /// that says otherwise is refused, so no copy ever holds more than its
    /// limit).
    pub fn accepts(&self, change: &LeaseChange) -> bool {
        match *change {
            LeaseChange::Grant { limit, at, lease } => {
                let live = self.live(at.max(self.last));
                let held: u64 = live.iter().map(|l| l.cost).sum();
                // A grant whose id is held already adds nothing, but still
                // sets the limit.
                let adds = if live.iter().any(|l| l.id == lease.id) {
                    0
                } else {
                    lease.cost
                };
                held.saturating_add(adds) <= limit
            }
            LeaseChange::Release { .. } | LeaseChange::Extend { .. } => true,
        }
    }

    /// Applies a change made at its own time; what had expired by then goes,
    /// and so does a lease whose new end is not after that time (a change
    /// made behind this copy's last one, whose lease is over here).
    pub fn apply(&mut self, change: LeaseChange) {
        let at = change.at().max(self.last);
        let first = self.held.partition_point(|l| l.expires_at <= at);
        self.held.drain(..first);
        self.last = at;
        match change {
            LeaseChange::Grant { limit, lease, .. } => {
                self.limit = limit;
                if self.held.iter().all(|l| l.id != lease.id) && lease.expires_at > at {
                    self.insert(lease);
                }
            }
            LeaseChange::Release { id, .. } => self.held.retain(|l| l.id != id),
            LeaseChange::Extend { id, expires_at, .. } => {
                if let Some(index) = self.held.iter().position(|l| l.id == id) {
                    let mut lease = self.held.remove(index);
                    lease.expires_at = expires_at;
                    if expires_at > at {
                        self.insert(lease);
                    }
                }
            }
        }
        if self.held.capacity() > self.held.len() + self.held.len() / 4 + 4 {
            self.held.shrink_to(self.held.len() + self.held.len() / 8);
        }
    }
}

/// Decides a request for `cost` slots at `now`. Returns the outcome and,
/// when granted, the lease to record (without an id: the caller picks one
/// the state does not hold, see `is_free`).
pub fn decide(
    state: Option<&Leases>,
    params: LeaseParams,
    now: Millis,
    cost: u64,
) -> (Outcome, Option<(Millis, Lease)>) {
    let now = clock(now);
    let empty;
    let leases = match state {
        Some(leases) => leases,
        None => {
            empty = Leases::new(params.limit);
            &empty
        }
    };
    let at = now.max(leases.last);
    let live = leases.live(at);
    let in_use: u64 = live.iter().map(|l| l.cost).sum();
    let limit = params.limit;
    // A peek (cost 0) is always granted, even over a lowered limit.
    let allowed = cost == 0 || (cost <= limit && in_use.saturating_add(cost) <= limit);
    let granted = (allowed && cost > 0).then_some(Lease {
        id: LeaseId(0),
        expires_at: at.saturating_add(bounds::duration(params.ttl)),
        cost,
    });
    let in_use_after = in_use + granted.map_or(0, |l| l.cost);
    let retry_after = if allowed {
        RetryAfter::After(Millis::ZERO)
    } else if cost > limit {
        RetryAfter::Never
    } else {
        // The earliest leases must end until `cost` fits: a release can only
        // make it sooner.
        let must_free = in_use + cost - limit;
        let mut freed = 0u64;
        let mut ready = at;
        for lease in live {
            freed += lease.cost;
            if freed >= must_free {
                ready = lease.expires_at;
                break;
            }
        }
        RetryAfter::After(until(ready, now))
    };
    let last_end = live
        .iter()
        .map(|l| l.expires_at)
        .chain(granted.map(|l| l.expires_at))
        .max();
    let outcome = Outcome {
        allowed,
        limit,
        remaining: limit.saturating_sub(in_use_after),
        retry_after,
        reset_after: last_end.map_or(Millis::ZERO, |end| until(end, now)),
    };
    (outcome, granted.map(|lease| (at, lease)))
}

/// Whether `id` is free to name a new lease in `state`.
pub fn is_free(state: Option<&Leases>, id: LeaseId) -> bool {
    state.is_none_or(|leases| leases.held.iter().all(|l| l.id != id))
}

/// The grant to record for a lease decided by `decide`, named `id`.
pub fn grant(params: LeaseParams, at: Millis, lease: Lease, id: LeaseId) -> LeaseChange {
    LeaseChange::Grant {
        limit: params.limit,
        at,
        lease: Lease { id, ..lease },
    }
}

/// Gives back the lease `id` at `now`. None when no such lease is held
/// (never granted, released already, or expired: its slots are free).
pub fn release(state: &Leases, id: LeaseId, now: Millis) -> Option<LeaseChange> {
    let at = clock(now).max(state.last);
    state.find(id, at).map(|_| LeaseChange::Release { at, id })
}

/// Keeps the lease `id` until `now + ttl` (shorter or longer than before).
/// None when no such lease is held: an expired lease is not revived, its
/// slots may have gone to someone else.
pub fn extend(state: &Leases, id: LeaseId, ttl: Millis, now: Millis) -> Option<LeaseChange> {
    let at = clock(now).max(state.last);
    state.find(id, at).map(|_| LeaseChange::Extend {
        at,
        id,
        expires_at: at.saturating_add(bounds::duration(ttl)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: LeaseParams = LeaseParams {
        limit: 3,
        ttl: Millis(1000),
    };

    /// Acquires `cost` at `now`, naming the lease `id` when granted.
    fn acquire(leases: &mut Leases, now: u64, cost: u64, id: u64) -> Outcome {
        let (outcome, granted) = decide(Some(leases), P, Millis(now), cost);
        if let Some((at, lease)) = granted {
            leases.apply(grant(P, at, lease, LeaseId(id)));
        }
        outcome
    }

    #[test]
    fn never_more_than_the_limit_held() {
        let mut leases = Leases::new(3);
        for id in 1..=3 {
            assert!(acquire(&mut leases, 100 * (id - 1), 1, id).allowed);
        }
        let denied = acquire(&mut leases, 10, 1, 4);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        // The earliest lease ends at 1000.
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(990)));
        assert!(acquire(&mut leases, 1000, 1, 5).allowed);
        assert_eq!(leases.in_use(Millis(1000)), 3);
    }

    #[test]
    fn release_frees_at_once_and_only_once() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 0, 3, 7);
        let change = release(&leases, LeaseId(7), Millis(5)).unwrap();
        leases.apply(change);
        assert_eq!(leases.in_use(Millis(5)), 0);
        assert_eq!(release(&leases, LeaseId(7), Millis(6)), None);
        // Never granted.
        assert_eq!(release(&leases, LeaseId(8), Millis(6)), None);
    }

    #[test]
    fn an_expired_lease_is_neither_released_nor_extended() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 0, 1, 1);
        assert_eq!(release(&leases, LeaseId(1), Millis(1000)), None);
        assert_eq!(extend(&leases, LeaseId(1), Millis(500), Millis(1000)), None);
        assert!(release(&leases, LeaseId(1), Millis(999)).is_some());
    }

    #[test]
    fn extend_moves_the_expiry_and_the_order() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 0, 1, 1);
        acquire(&mut leases, 100, 2, 2);
        leases.apply(extend(&leases, LeaseId(1), Millis(5000), Millis(500)).unwrap());
        assert_eq!(leases.held()[1].id, LeaseId(1));
        assert_eq!(leases.held()[1].expires_at, Millis(5500));
        // Lease 2 (2 slots) ends first: a request of 2 waits for it.
        let (denied, _) = decide(Some(&leases), P, Millis(600), 2);
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(500)));
        assert_eq!(denied.reset_after, Millis(4900));
    }

    #[test]
    fn weighted_slots_and_never() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 0, 2, 1);
        assert!(!acquire(&mut leases, 1, 2, 2).allowed);
        assert!(acquire(&mut leases, 1, 1, 3).allowed);
        let (never, _) = decide(Some(&leases), P, Millis(2), 4);
        assert_eq!(never.retry_after, RetryAfter::Never);
    }

    #[test]
    fn a_peek_is_allowed_over_a_lowered_limit() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 0, 3, 1);
        let lowered = LeaseParams { limit: 1, ..P };
        let (peek, granted) = decide(Some(&leases), lowered, Millis(1), 0);
        assert!(peek.allowed && granted.is_none());
        assert_eq!(peek.remaining, 0);
        let (denied, _) = decide(Some(&leases), lowered, Millis(1), 1);
        // All three slots must go before one fits under a limit of one.
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(999)));
    }

    #[test]
    fn a_clock_that_goes_back_ends_no_lease_early() {
        let mut leases = Leases::new(3);
        acquire(&mut leases, 5000, 3, 1);
        let (denied, _) = decide(Some(&leases), P, Millis(100), 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, RetryAfter::After(Millis(5900)));
    }

    #[test]
    fn ids_in_hex() {
        let id = LeaseId(0x0123_4567_89ab_cdef);
        assert_eq!(&id.to_hex(), b"0123456789abcdef");
        assert_eq!(LeaseId::from_hex(b"0123456789ABCDEF"), Some(id));
        for bad in [
            &b"0123"[..],
            b"0123456789abcdeg",
            b"0123456789abcdef0",
            b"+123456789abcdef",
        ] {
            assert_eq!(LeaseId::from_hex(bad), None);
        }
    }

    #[test]
    fn restored_refuses_what_could_not_be_written() {
        let lease = |id, at, cost| Lease {
            id: LeaseId(id),
            expires_at: Millis(at),
            cost,
        };
        assert!(Leases::restored(3, Millis(0), vec![lease(1, 5, 1), lease(2, 5, 2)]).is_some());
        assert!(Leases::restored(3, Millis(0), vec![lease(2, 5, 1), lease(1, 5, 1)]).is_none());
        assert!(Leases::restored(3, Millis(0), vec![lease(1, 5, 1), lease(1, 6, 1)]).is_none());
        assert!(Leases::restored(3, Millis(0), vec![lease(1, 5, 0)]).is_none());
        assert!(Leases::restored(0, Millis(0), vec![]).is_none());
        assert!(Leases::restored(3, Millis(0), vec![lease(1, 5, MAX_LEASE_LIMIT + 1)]).is_none());
        // A lease expired by the last change would have been dropped by it.
        assert!(Leases::restored(3, Millis(5), vec![lease(1, 5, 1)]).is_none());
    }
}
