//! Closure: every state the loader accepts, changed by any command or
//! effect at any time, is again a state the loader accepts. States are
//! built field by field with every field's extremes (and just past them),
//! kept when they decode; then a sequence of requests (every option),
//! CL.THROTTLE's path, refunds, unlocks, lease releases and extensions,
//! and RL.APPLY payloads runs on them at times from 0 to u64::MAX, and
//! after each step the state must encode to bytes that decode to itself.
//! A state that failed this would be written to an RDB the server cannot
//! load again.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

use super::{encoded, encoded_effect, fuzz_config, log_bytes, same_limiter};
use crate::core::bounds::{MAX_DEADLINE, MAX_PERIOD, MAX_TIME};
use crate::core::calendar::{Calendar, Unit, ZoneName};
use crate::core::calendar_window::CalendarParams;
use crate::core::codec::{decode_effect, decode_limiter, decode_stored};
use crate::core::gcra::{self, GcraParams, Interval};
use crate::core::lease::{self, LeaseId, LeaseParams, MAX_LEASE_LIMIT};
use crate::core::limiter::{Effect, Limiter};
use crate::core::policy::{Policy, Request};
use crate::core::sliding_log::LogParams;
use crate::core::token_bucket::TokenBucketParams;
use crate::core::window::WindowParams;
use crate::core::{Millis, MAX_COUNT};

/// A 2026 clock reading, where real traffic happens.
const TODAY: u64 = 1_796_000_000_000;

fn time() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        TODAY - 10_000..TODAY + 10_000,
        Just(MAX_TIME.0 - MAX_PERIOD.0),
        MAX_TIME.0 - 5..=MAX_TIME.0 + 1,
        0..=MAX_TIME.0,
    ]
}

fn deadline() -> impl Strategy<Value = u64> {
    prop_oneof![
        time(),
        MAX_DEADLINE.0 - 2..=MAX_DEADLINE.0 + 1,
        0..=MAX_DEADLINE.0,
    ]
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1..=5u64,
        1 => Just(MAX_COUNT - 1),
        1 => Just(MAX_COUNT),
        1 => 1..=MAX_COUNT,
    ]
}

/// 0 to the largest count, with its neighbours.
fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), count(), Just(MAX_COUNT + 1),]
}

fn period() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1..=2_000u64,
        1 => Just(MAX_PERIOD.0),
        1 => 1..=MAX_PERIOD.0,
    ]
}

fn lease_count() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1..=5u64,
        1 => Just(MAX_LEASE_LIMIT),
        1 => 1..=MAX_LEASE_LIMIT,
    ]
}

fn window_count_strategy() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        2 => Just(0u64),
        2 => 1..=5u64,
        1 => Just(MAX_COUNT),
        1 => Just(MAX_COUNT + 1),
    ]
}

fn words(kind: u8, fields: &[u64]) -> Vec<u8> {
    let mut bytes = vec![1, kind];
    for field in fields {
        bytes.extend_from_slice(&field.to_le_bytes());
    }
    bytes
}

/// A 128-bit value as the codec's two words, high first.
fn wide(value: u128) -> [u64; 2] {
    [(value >> 64) as u64, value as u64]
}

/// Encodings of states of every kind, mostly valid, fields at their extremes.
fn state_bytes() -> impl Strategy<Value = Vec<u8>> {
    let bucket = (count(), count(), period(), time(), 0..=4u8, any::<u128>()).prop_map(
        |(capacity, amount, period, last, level_kind, random)| {
            let full = u128::from(capacity) * u128::from(period);
            let level = match level_kind {
                0 => 0,
                1 => full,
                2 => full.saturating_sub(1),
                _ => random % (full + 1),
            };
            let [hi, lo] = wide(level);
            words(1, &[capacity, amount, period, last, hi, lo])
        },
    );
    let window_count = window_count_strategy();
    let window = (
        any::<bool>(),
        count(),
        period(),
        time(),
        window_count.clone(),
        window_count,
    )
        .prop_map(|(sliding, limit, period, start, previous, current)| {
            let previous = if sliding { previous } else { 0 };
            words(
                if sliding { 3 } else { 2 },
                &[limit, period, start, previous, current],
            )
        });
    let log = (
        count(),
        period(),
        time(),
        vec((0..3_000u64, 1..=3u64), 0..6),
    )
        .prop_map(|(limit, period, first, entries)| {
            // The first gap is the oldest entry's time, the rest are gaps > 0.
            let mut gaps: Vec<(u64, u64)> = entries
                .iter()
                .enumerate()
                .map(|(i, &(gap, n))| (if i == 0 { first } else { gap.max(1) }, n))
                .collect();
            gaps.truncate(1 + usize::try_from(limit).unwrap_or(usize::MAX).min(5));
            let newest = gaps.iter().fold(0u64, |t, (gap, _)| t.saturating_add(*gap));
            let last = if gaps.is_empty() { first } else { newest };
            log_bytes(limit, period, last, gaps.len() as u64, gaps)
        });
    let gcra = (
        count(),
        count(),
        period(),
        any::<bool>(),
        prop_oneof![
            Just(0u128),
            time().prop_map(|t| u128::from(t) * 1_000_000),
            (time(), any::<u64>())
                .prop_map(|(t, ahead)| u128::from(t) * 1_000_000 + u128::from(ahead) * 1_000_000),
            any::<u128>().prop_map(|t| t % (1 << 96)),
        ],
    )
        .prop_map(|(limit, rate, period, cell, tat)| {
            let [hi, lo] = wide(tat);
            words(5, &[limit, rate, period, u64::from(cell), hi, lo])
        });
    let leases = (
        lease_count(),
        time(),
        vec((any::<u64>(), 1..=MAX_PERIOD.0, lease_count()), 0..5),
    )
        .prop_map(|(limit, last, held)| {
            let mut held: Vec<(u64, u64, u64)> = held
                .into_iter()
                .map(|(id, ttl, cost)| (id, last.saturating_add(ttl), cost))
                .collect();
            held.sort_by_key(|&(id, end, _)| (end, id));
            let mut fields = vec![limit, last, held.len() as u64];
            for (id, end, cost) in held {
                fields.extend([id, end, cost]);
            }
            words(7, &fields)
        });
    let zones = prop_oneof![
        Just("UTC"),
        Just("Europe/Berlin"),
        Just("Pacific/Apia"),
        Just("Mars/Olympus"),
        Just("")
    ];
    let calendar = (
        count(),
        time(),
        prop_oneof![
            Just(1u64),
            1..=3_600_000u64,
            Just(368 * 86_400_000),
            Just(368 * 86_400_000 + 1)
        ],
        window_count_strategy(),
        0..=5u64,
        0..=32u64,
        zones,
    )
        .prop_map(|(limit, start, length, count, unit, anchor, zone)| {
            let mut bytes = words(
                8,
                &[
                    limit,
                    start,
                    start.saturating_add(length),
                    count,
                    unit,
                    anchor,
                    zone.len() as u64,
                ],
            );
            bytes.extend_from_slice(zone.as_bytes());
            bytes
        });
    let unlocked =
        prop_oneof![2 => bucket, 3 => window, 2 => log, 2 => gcra, 3 => leases, 3 => calendar];
    (unlocked, any::<bool>(), deadline()).prop_map(|(inner, lock, until)| {
        if lock {
            let mut bytes = words(6, &[until]);
            bytes.extend(inner);
            bytes
        } else {
            inner
        }
    })
}

fn valid_state() -> impl Strategy<Value = Limiter> {
    state_bytes().prop_filter_map("not loadable", |bytes| decode_limiter(&bytes))
}

/// When a step runs: an absolute time, or an offset from the state's own
/// expiry (where its interesting moments are).
#[derive(Clone, Copy, Debug)]
enum When {
    At(u64),
    FromExpiry(i64),
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        3 => time().prop_map(When::At),
        1 => Just(When::At(u64::MAX)),
        1 => (MAX_TIME.0..=MAX_DEADLINE.0 + 1).prop_map(When::At),
        4 => (-5_000i64..5_000).prop_map(When::FromExpiry),
    ]
}

#[derive(Clone, Debug)]
enum Step {
    /// A request with any options, under parameters of the state's own
    /// algorithm (drawn from the seeds).
    Request {
        when: When,
        seeds: [u64; 3],
        cell: bool,
        cost: u64,
        partial: bool,
        lockout: Option<u64>,
        count_denied: bool,
        id: u64,
    },
    /// CL.THROTTLE: GCRA's decide on its own, redis-cell's interval.
    Throttle {
        when: When,
        seeds: [u64; 3],
        cost: u64,
    },
    Refund {
        when: When,
        amount: u64,
    },
    Unlock {
        when: When,
    },
    /// RL.RELEASE or RL.EXTEND of a held lease (or of any id).
    Lease {
        when: When,
        pick: usize,
        ttl: Option<u64>,
        id: u64,
    },
    /// RL.APPLY of a payload that decodes.
    Apply(Vec<u8>),
}

fn effect_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        state_bytes(),
        (count(), period(), time(), count()).prop_map(|(l, p, at, c)| words(0x80, &[l, p, at, c])),
        (time(), count()).prop_map(|(at, amount)| words(0x81, &[at, amount])),
        (
            lease_count(),
            time(),
            any::<u64>(),
            0..=MAX_PERIOD.0 + 1,
            lease_count()
        )
            .prop_map(|(limit, at, id, ttl, cost)| words(
                0x82,
                &[limit, at, id % 4, at.saturating_add(ttl), cost]
            )),
        (time(), any::<u64>()).prop_map(|(at, id)| words(0x83, &[at, id % 4])),
        (time(), any::<u64>(), 0..=MAX_PERIOD.0 + 1)
            .prop_map(|(at, id, ttl)| words(0x84, &[at, id % 4, at.saturating_add(ttl)])),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let seeds = [any::<u64>(), any::<u64>(), any::<u64>()];
    prop_oneof![
        4 => (
            when(),
            seeds,
            any::<bool>(),
            amount(),
            any::<bool>(),
            prop::option::of(period()),
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(|(when, seeds, cell, cost, partial, lockout, count_denied, id)| Step::Request {
                when,
                seeds,
                cell,
                cost,
                partial,
                lockout,
                count_denied,
                id: id % 4,
            }),
        1 => (when(), seeds, amount()).prop_map(|(when, seeds, cost)| Step::Throttle { when, seeds, cost }),
        2 => (when(), amount()).prop_map(|(when, amount)| Step::Refund { when, amount }),
        1 => when().prop_map(|when| Step::Unlock { when }),
        2 => (when(), any::<usize>(), prop::option::of(period()), any::<u64>())
            .prop_map(|(when, pick, ttl, id)| Step::Lease { when, pick, ttl, id: id % 4 }),
        2 => effect_bytes().prop_map(Step::Apply),
    ]
}

/// Parameters from seeds, each within the parser's bounds, with the
/// extremes likely.
fn pick(seed: u64, low: u64, high: u64) -> u64 {
    match seed % 4 {
        0 => low,
        1 => high,
        2 => low + (seed >> 2) % 5.min(high - low + 1),
        _ => low + (seed >> 2) % (high - low + 1),
    }
}

fn policy_for(
    state: &Limiter,
    seeds: [u64; 3],
    cell: bool,
    count_denied: bool,
    id: u64,
) -> Option<Policy> {
    let count = |i: usize| pick(seeds[i], 1, MAX_COUNT);
    let period = Millis(pick(seeds[2], 1, MAX_PERIOD.0));
    Some(match state.algorithm() {
        crate::core::limiter::Algorithm::TokenBucket => Policy::TokenBucket(TokenBucketParams {
            capacity: count(0),
            refill_amount: count(1),
            refill_period: period,
        }),
        crate::core::limiter::Algorithm::FixedWindow
        | crate::core::limiter::Algorithm::SlidingWindow => Policy::Window {
            params: WindowParams {
                limit: count(0),
                period,
            },
            sliding: state.algorithm() == crate::core::limiter::Algorithm::SlidingWindow,
        },
        crate::core::limiter::Algorithm::SlidingLog => Policy::SlidingLog {
            params: LogParams {
                limit: count(0),
                period,
            },
            count_denied,
        },
        crate::core::limiter::Algorithm::Gcra => {
            let params = GcraParams {
                limit: count(0),
                rate: count(1),
                period,
                interval: if cell {
                    Interval::RedisCell
                } else {
                    Interval::RoundUp
                },
            };
            params.check().ok()?;
            Policy::Gcra(params)
        }
        crate::core::limiter::Algorithm::CalendarWindow => {
            let unit = [Unit::Day, Unit::Week, Unit::Month, Unit::Year][(seeds[1] % 4) as usize];
            let anchors = unit.anchors();
            let zone = ["UTC", "Europe/Berlin", "Pacific/Apia", "America/Santiago"]
                [(seeds[2] % 4) as usize];
            Policy::Calendar(CalendarParams {
                limit: count(0),
                calendar: Calendar {
                    unit,
                    anchor: pick(
                        seeds[1] >> 2,
                        u64::from(*anchors.start()),
                        u64::from(*anchors.end()),
                    ) as u8,
                    zone: ZoneName::known(zone.as_bytes()).unwrap(),
                },
            })
        }
        crate::core::limiter::Algorithm::Lease => Policy::Lease {
            params: LeaseParams {
                limit: pick(seeds[0], 1, MAX_LEASE_LIMIT),
                ttl: period,
            },
            id: LeaseId(id),
        },
    })
}

fn resolve(when: When, state: &Limiter) -> Millis {
    match when {
        When::At(t) => Millis(t),
        When::FromExpiry(dt) => Millis(state.expires_at().0.saturating_add_signed(dt)),
    }
}

/// The effect a step makes, as the command's shell would make it.
fn effect_of(state: &Limiter, step: &Step) -> Option<Effect> {
    match step {
        &Step::Request {
            when,
            seeds,
            cell,
            cost,
            partial,
            lockout,
            count_denied,
            id,
        } => {
            let now = resolve(when, state);
            let policy = policy_for(state, seeds, cell, count_denied, id)?;
            let is_lease = matches!(policy, Policy::Lease { .. });
            if let (Limiter::Lease(leases), true) = (state, is_lease) {
                // The shell draws another id when this one is held.
                if !lease::is_free(Some(leases), LeaseId(id)) {
                    return None;
                }
            }
            let request = Request {
                cost: if is_lease {
                    cost.min(MAX_LEASE_LIMIT)
                } else {
                    cost
                },
                // RL.LEASE takes neither.
                partial: partial && !is_lease,
                lockout: lockout.filter(|_| !is_lease).map(Millis),
            };
            policy.decide_request(Some(state), now, request).effect
        }
        &Step::Throttle { when, seeds, cost } => {
            let now = resolve(when, state);
            let policy = policy_for(state, seeds, true, false, 0)?;
            let Policy::Gcra(params) = policy else {
                return None;
            };
            match state.unlocked_at(now) {
                Limiter::Gcra(g) => gcra::decide(Some(g), params, now, cost)
                    .1
                    .map(|g| Effect::Replace(Limiter::Gcra(g))),
                locked => {
                    policy
                        .decide_request(
                            Some(locked),
                            now,
                            Request {
                                cost,
                                ..Request::default()
                            },
                        )
                        .effect
                }
            }
        }
        &Step::Refund { when, amount } => {
            if matches!(state, Limiter::Lease(_)) {
                return None;
            }
            state.refund(resolve(when, state), amount.max(1)).0
        }
        &Step::Unlock { when } => match state {
            Limiter::Locked(locked) if locked.until > resolve(when, state) => {
                Some(Effect::Replace(locked.inner.clone()))
            }
            _ => None,
        },
        &Step::Lease {
            when,
            pick,
            ttl,
            id,
        } => {
            let Limiter::Lease(leases) = state else {
                return None;
            };
            let now = resolve(when, state);
            let id = match leases.held() {
                [] => LeaseId(id),
                held => held[pick % held.len()].id,
            };
            let change = match ttl {
                Some(ttl) => lease::extend(leases, id, Millis(ttl), now),
                None => lease::release(leases, id, now),
            };
            change.map(Effect::Lease)
        }
        Step::Apply(bytes) => decode_effect(bytes),
    }
}

fn check_loadable(state: &Limiter) -> Result<(), TestCaseError> {
    let bytes = encoded(state);
    let back = decode_limiter(&bytes);
    prop_assert!(
        back.as_ref().is_some_and(|b| same_limiter(b, state)),
        "not loadable again: {:?}",
        state
    );
    prop_assert_eq!(encoded(back.as_ref().unwrap()), bytes);
    Ok(())
}

proptest! {
    // Cheap (a few thousand cases a second): `make test` runs 4,096,
    // `make fuzz` RL_FUZZ_CASES.
    #![proptest_config(Config { cases: fuzz_config().cases.max(4096), ..fuzz_config() })]

    #[test]
    fn every_change_to_a_loadable_state_is_loadable(
        state in valid_state(),
        steps in vec(step(), 1..10),
    ) {
        let mut state = state;
        for step in &steps {
            let Some(effect) = effect_of(&state, step) else { continue };
            // Every effect a command makes applies; a payload may be refused
            // (WRONGTYPE, or a grant beyond the limit), and then changes nothing.
            let before = state.clone();
            let made_by_command = !matches!(step, Step::Apply(_));
            match state.apply(effect.clone()) {
                Ok(()) => check_loadable(&state)?,
                Err(error) => {
                    prop_assert!(!made_by_command, "{:?} refused ({:?}) on {:?}", effect, error, before);
                    prop_assert!(same_limiter(&state, &before));
                }
            }
            // The same effect made on a key that holds nothing.
            if let Ok(Some(created)) = Limiter::from_effect(effect) {
                check_loadable(&created)?;
            }
        }
    }
}

proptest! {
    #![proptest_config(Config { cases: fuzz_config().cases.max(4096), ..fuzz_config() })]

    /// What a file load repairs is a state this version writes: it loads
    /// strictly afterwards, and a state that loads strictly is not touched.
    #[test]
    fn a_repaired_state_is_loadable(bytes in state_bytes()) {
        let strict = decode_limiter(&bytes);
        if let Some((limiter, repaired)) = decode_stored(&bytes) {
            prop_assert_eq!(repaired, strict.is_none());
            check_loadable(&limiter)?;
            if let Some(strict) = strict {
                prop_assert!(same_limiter(&strict, &limiter));
            }
        } else {
            prop_assert!(strict.is_none());
        }
    }
}

/// The generators reach every kind of state, locked or not, and every kind
/// of step makes effects, so the closure property above is not vacuous for
/// any of them (a fixed seed: this checks the generators, not the code).
#[test]
fn the_generators_reach_every_kind() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut kinds = std::collections::BTreeSet::new();
    let mut effective = std::collections::HashSet::new();
    for _ in 0..2000 {
        let state = valid_state().new_tree(&mut runner).unwrap().current();
        kinds.insert((state.algorithm() as u8, matches!(state, Limiter::Locked(_))));
        for step in vec(step(), 1..10).new_tree(&mut runner).unwrap().current() {
            if effect_of(&state, &step).is_some() {
                effective.insert(std::mem::discriminant(&step));
            }
        }
    }
    for algorithm in [1u8, 2, 3, 4, 5, 7, 8] {
        assert!(
            kinds.contains(&(algorithm, false)),
            "{algorithm} unlocked missing"
        );
        assert_eq!(
            kinds.contains(&(algorithm, true)),
            algorithm != 7,
            "{algorithm} locked"
        );
    }
    assert_eq!(effective.len(), 6, "a kind of step never made an effect");
}

/// The four states of the issue that made an RDB unloadable or were
/// accepted though no command could write them.
#[test]
fn the_reported_states() {
    // A lease limiter stored at 2^53 ms: a grant there stays loadable.
    let at_max = words(7, &[5, MAX_TIME.0, 0]);
    let mut state = decode_limiter(&at_max).expect("a lease limiter at MAX_TIME loads");
    let policy = Policy::Lease {
        params: LeaseParams {
            limit: 5,
            ttl: Millis(3_600_000),
        },
        id: LeaseId(1),
    };
    let decision = policy.decide_request(
        Some(&state),
        Millis(TODAY),
        Request {
            cost: 1,
            ..Request::default()
        },
    );
    assert!(decision.outcome.allowed);
    state.apply(decision.effect.expect("a grant")).unwrap();
    assert!(decode_limiter(&encoded(&state)).is_some_and(|b| b == state));

    // 3 slots held under a limit of 2.
    let over = words(7, &[2, TODAY, 1, 9, TODAY + 1000, 3]);
    assert!(decode_limiter(&over).is_none());
    assert!(decode_limiter(&words(7, &[3, TODAY, 1, 9, TODAY + 1000, 3])).is_some());

    // A lease ending 3,651 days after the last change.
    let day = 86_400_000;
    let far = words(7, &[2, TODAY, 1, 9, TODAY + 3651 * day, 1]);
    assert!(decode_limiter(&far).is_none());
    assert!(decode_limiter(&words(7, &[2, TODAY, 1, 9, TODAY + 3650 * day, 1])).is_some());

    // A locked GCRA limiter whose TAT lies 20 years before the lock began.
    let lock_start = TODAY;
    let until = lock_start + 60_000;
    let gcra_at = |tat_ms: u64| {
        let [hi, lo] = wide(u128::from(tat_ms) * 1_000_000);
        let mut bytes = words(6, &[until]);
        bytes.extend(words(5, &[5, 1, 1000, 0, hi, lo]));
        bytes
    };
    assert!(decode_limiter(&gcra_at(lock_start - 20 * 365 * day)).is_none());
    // A file holding them (written by an earlier version) loads them repaired.
    for legacy in [over, far, gcra_at(lock_start - 20 * 365 * day)] {
        let (repaired, was) = decode_stored(&legacy).expect("repaired");
        assert!(was);
        assert!(decode_limiter(&encoded(&repaired)).is_some_and(|r| r == repaired));
    }
    assert!(decode_limiter(&gcra_at(lock_start + 1000)).is_some());

    // An RL.APPLY grant beyond the limit is refused and changes nothing.
    let mut held = decode_limiter(&words(7, &[3, TODAY, 1, 9, TODAY + 1000, 3])).unwrap();
    let before = held.clone();
    let grant = decode_effect(&words(0x82, &[3, TODAY, 8, TODAY + 1000, 1])).unwrap();
    assert!(held.apply(grant).is_err());
    assert_eq!(held, before);
}

/// What the generator's encodings look like is checked by decoding: the
/// encoded effects of every kind decode.
#[test]
fn effect_words_decode() {
    for bytes in [
        words(0x80, &[5, 1000, TODAY, 1]),
        words(0x81, &[TODAY, 1]),
        words(0x82, &[3, TODAY, 1, TODAY + 1, 1]),
        words(0x83, &[TODAY, 1]),
        words(0x84, &[TODAY, 1, TODAY + 1]),
    ] {
        let effect = decode_effect(&bytes).expect("decodes");
        assert_eq!(encoded_effect(&effect), bytes);
    }
}
