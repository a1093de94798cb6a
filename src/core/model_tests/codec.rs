//! Codec: round trips of every stored state and effect, refusal of
//! truncated, extended and non-canonical encodings, and robustness against
//! random and mutated bytes.

use proptest::collection::vec;
use proptest::prelude::*;

use super::{
    advance, config, cost_for, count, encoded, encoded_effect, exercise, fuzz_config, log_bytes,
    period, same_limiter, start, steps, tb_params, Step, LOG_HEADER,
};
use crate::core::codec::{decode_effect, decode_limiter};
use crate::core::gcra::{self, Gcra, GcraParams, Interval};
use crate::core::limiter::{Effect, Limiter, Locked};
use crate::core::sliding_log::{self, LogParams, LogRecord, SlidingLog};
use crate::core::token_bucket::{self, TokenBucket, TokenBucketParams};
use crate::core::window::{self, Window, WindowParams};
use crate::core::{Millis, MAX_COUNT, MAX_PERIOD, MIN_PERIOD};

// ---------------------------------------------------------------------------
// Codec.

#[derive(Clone, Copy, Debug)]
enum Kind {
    Bucket,
    Fixed,
    Sliding,
    Log { count_denied: bool },
    Gcra { cell: bool },
}

#[derive(Clone, Debug)]
struct Scenario {
    kind: Kind,
    bucket: TokenBucketParams,
    start: u64,
    steps: Vec<Step<TokenBucketParams>>,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Bucket),
        Just(Kind::Fixed),
        Just(Kind::Sliding),
        any::<bool>().prop_map(|count_denied| Kind::Log { count_denied }),
        any::<bool>().prop_map(|cell| Kind::Gcra { cell }),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (kind(), tb_params(), start(), steps(tb_params(), 10, 40)).prop_map(
        |(kind, bucket, start, steps)| Scenario {
            kind,
            bucket,
            start,
            steps,
        },
    )
}

/// Every state a scenario stores, and the effects that produced them.
fn play(s: &Scenario) -> (Vec<Limiter>, Vec<Effect>) {
    let mut limiters = Vec::new();
    let mut effects = Vec::new();
    let mut now = s.start;
    let mut bucket: Option<TokenBucket> = None;
    let mut window: Option<Window> = None;
    let mut log: Option<SlidingLog> = None;
    let mut limiter_gcra: Option<Gcra> = None;
    let mut tb_params = s.bucket;
    // Windows and logs take the capacity as limit and the refill period as
    // period; their limit follows the bucket's capacity changes, except for a
    // COUNTDENIED log, whose parameters stay fixed.
    let period = s.bucket.refill_period;
    let mut limit = s.bucket.capacity;
    for step in &s.steps {
        now = advance(now, step.dt);
        if let Some(p) = step.change {
            tb_params = p;
            if !matches!(s.kind, Kind::Log { count_denied: true }) {
                limit = p.capacity;
            }
        }
        let cost = cost_for(step.cost, limit);
        let limiter = match s.kind {
            Kind::Bucket => {
                let (_, next) = token_bucket::decide(bucket.as_ref(), tb_params, Millis(now), cost);
                bucket = next.or(bucket);
                next.map(Limiter::TokenBucket)
            }
            Kind::Fixed | Kind::Sliding => {
                let sliding = matches!(s.kind, Kind::Sliding);
                let params = WindowParams { limit, period };
                let (_, next) = window::decide(window.as_ref(), params, sliding, Millis(now), cost);
                window = next.or(window);
                next.map(|w| {
                    if sliding {
                        Limiter::SlidingWindow(w)
                    } else {
                        Limiter::FixedWindow(w)
                    }
                })
            }
            Kind::Log { count_denied } => {
                let params = LogParams { limit, period };
                let (_, record) =
                    sliding_log::decide(log.as_ref(), params, Millis(now), cost, count_denied);
                record.map(|record| {
                    effects.push(Effect::LogRecord(record));
                    let log = log.get_or_insert_with(|| SlidingLog::new(params));
                    log.apply(record);
                    Limiter::SlidingLog(Box::new(log.clone()))
                })
            }
            Kind::Gcra { cell } => {
                let params = GcraParams {
                    limit,
                    rate: tb_params.refill_amount,
                    period: tb_params.refill_period,
                    interval: if cell {
                        Interval::RedisCell
                    } else {
                        Interval::RoundUp
                    },
                };
                let (_, next) = gcra::decide(limiter_gcra.as_ref(), params, Millis(now), cost);
                limiter_gcra = next.or(limiter_gcra);
                next.map(Limiter::Gcra)
            }
        };
        if let Some(limiter) = limiter {
            effects.push(Effect::Replace(limiter.clone()));
            limiters.push(limiter);
        }
    }
    (limiters, effects)
}

fn same_effect(a: &Effect, b: &Effect) -> bool {
    match (a, b) {
        (Effect::Replace(x), Effect::Replace(y)) => same_limiter(x, y),
        _ => a == b,
    }
}

fn count_ok(n: u64) -> bool {
    (1..=MAX_COUNT).contains(&n)
}

fn period_ok(p: Millis) -> bool {
    (MIN_PERIOD..=MAX_PERIOD).contains(&p)
}

/// A limiter this code could have stored: parameters in range, a bucket's
/// level at most full, window counts at most the largest limit, log counts
/// at most the largest limit + 1 (an entry's cap) with a total that fits.
fn plausible_limiter(limiter: &Limiter) -> bool {
    match limiter {
        Limiter::TokenBucket(b) => {
            count_ok(b.params.capacity)
                && count_ok(b.params.refill_amount)
                && period_ok(b.params.refill_period)
                && b.level() <= u128::from(b.params.capacity) * u128::from(b.params.refill_period.0)
        }
        Limiter::FixedWindow(w) => {
            count_ok(w.params.limit)
                && period_ok(w.params.period)
                && w.previous == 0
                && w.current <= MAX_COUNT
        }
        Limiter::SlidingWindow(w) => {
            count_ok(w.params.limit)
                && period_ok(w.params.period)
                && w.previous <= MAX_COUNT
                && w.current <= MAX_COUNT
        }
        Limiter::Locked(l) => {
            !matches!(l.inner, Limiter::Locked(_) | Limiter::Lease(_))
                && l.until <= crate::core::bounds::MAX_DEADLINE
                && lock_follows_denial(l)
                && plausible_limiter(&l.inner)
        }
        Limiter::CalendarWindow(w) => {
            count_ok(w.params.limit)
                && w.params.calendar.is_valid()
                && w.start < w.end
                && w.end.0 - w.start.0 <= crate::core::calendar::MAX_CALENDAR_PERIOD.0
                && w.start <= crate::core::MAX_TIME
                && w.count <= MAX_COUNT
        }
        Limiter::Gcra(g) => {
            count_ok(g.params().limit)
                && count_ok(g.params().rate)
                && period_ok(g.params().period)
                && g.params().check().is_ok()
                && g.tat().0 < 1 << 96
        }
        Limiter::Lease(l) => {
            (1..=crate::core::lease::MAX_LEASE_LIMIT).contains(&l.limit)
                && l.last_update() <= crate::core::MAX_TIME
                && l.held().iter().map(|x| x.cost).sum::<u64>() <= l.limit
                && l.held().iter().all(|x| {
                    x.cost >= 1
                        && x.expires_at > l.last_update()
                        && x.expires_at.0 - l.last_update().0 <= MAX_PERIOD.0
                })
        }
        Limiter::SlidingLog(log) => {
            count_ok(log.params.limit)
                && period_ok(log.params.period)
                && log
                    .entries()
                    .all(|(_, count)| (1..=MAX_COUNT + 1).contains(&count))
                && log
                    .entries()
                    .try_fold(0u64, |sum, (_, count)| sum.checked_add(count))
                    == Some(log.total())
                && log
                    .entries()
                    .last()
                    .is_none_or(|(t, _)| t == log.last_update())
                && log
                    .entries()
                    .zip(log.entries().skip(1))
                    .all(|(a, b)| a.0 < b.0)
        }
    }
}

/// A locked GCRA limiter was denied when the lock began (its TAT ahead of
/// the clock), at most the longest lockout before the lock ends.
fn lock_follows_denial(l: &Locked) -> bool {
    match &l.inner {
        Limiter::Gcra(g) => {
            g.tat().0 >= u128::from(l.until.0.saturating_sub(MAX_PERIOD.0)) * 1_000_000
        }
        _ => true,
    }
}

/// Whatever bytes decode must decode to something this code could have
/// written, written back the same way (canonical), and be usable.
fn check_decoded(input: &[u8]) -> Result<(), TestCaseError> {
    if let Some(limiter) = decode_limiter(input) {
        prop_assert!(
            plausible_limiter(&limiter),
            "{:?} from {:?}",
            limiter,
            input
        );
        exercise(&limiter);
        // Canonical: no overlong varint, no other spelling of the same log.
        prop_assert_eq!(encoded(&limiter), input.to_vec(), "{:?}", limiter);
        let again = decode_limiter(&encoded(&limiter));
        prop_assert!(again.is_some_and(|a| same_limiter(&a, &limiter)));
    }
    match decode_effect(input) {
        Some(Effect::Replace(limiter)) => {
            let direct = decode_limiter(input);
            prop_assert!(direct.is_some_and(|d| same_limiter(&d, &limiter)));
        }
        Some(Effect::LogRecord(record)) => {
            prop_assert!(
                count_ok(record.params.limit)
                    && period_ok(record.params.period)
                    && count_ok(record.cost),
                "{:?} from {:?}",
                record,
                input
            );
            prop_assert_eq!(encoded_effect(&Effect::LogRecord(record)), input.to_vec());
            let mut log = SlidingLog::new(record.params);
            log.apply(record);
        }
        Some(Effect::Lease(change)) => {
            prop_assert!(change.at() <= crate::core::MAX_TIME);
            prop_assert_eq!(encoded_effect(&Effect::Lease(change)), input.to_vec());
            let mut leases = crate::core::lease::Leases::new(1);
            leases.apply(change);
        }
        Some(Effect::LogRefund { at, amount }) => {
            prop_assert!(count_ok(amount) && at <= crate::core::MAX_TIME);
            prop_assert_eq!(
                encoded_effect(&Effect::LogRefund { at, amount }),
                input.to_vec()
            );
        }
        None => {}
    }
    Ok(())
}

/// Byte strings that get past the first checks: a valid header with small
/// fields, then anything.
fn plausible_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![1..=4u8, Just(7u8), 0x80..=0x84u8, any::<u8>()],
        vec(
            prop_oneof![1..=20u64, 1..=2000u64, 0..3u64, any::<u64>()],
            0..10,
        ),
        vec(any::<u8>(), 0..24),
    )
        .prop_map(|(kind, words, tail)| {
            let mut bytes = vec![1, kind];
            for word in words {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            bytes.extend(tail);
            bytes
        })
}

/// Sliding log encodings built field by field, entries (gap, count) with
/// small values including the invalid 0s and counts around the cap, `last`
/// at or near the newest entry's time, the entry count right or nearly.
fn plausible_log_bytes() -> impl Strategy<Value = Vec<u8>> {
    let entry = prop_oneof![
        8 => 0..3u64,
        1 => Just(MAX_COUNT + 1),
        1 => Just(MAX_COUNT + 2),
        1 => Just(u64::MAX),
    ];
    (
        count(),
        period(),
        vec((0..4u64, entry), 0..6),
        prop_oneof![3 => Just(0i64), 1 => -1..=1i64],
        prop_oneof![3 => Just(0i64), 1 => -1..=1i64],
    )
        .prop_map(|(limit, period, entries, skew, count_skew)| {
            let newest: u64 = entries.iter().map(|(gap, _)| gap).sum();
            let entry_count = (entries.len() as u64).saturating_add_signed(count_skew);
            log_bytes(
                limit,
                period,
                newest.saturating_add_signed(skew),
                entry_count,
                entries,
            )
        })
}

proptest! {
    #![proptest_config(config())]

    /// A locked limiter (LOCKOUT) round-trips with its lock and its inner
    /// state; a lock inside a lock is refused.
    #[test]
    fn codec_locked_limiters_round_trip(
        s in scenario(),
        until in 0..=crate::core::bounds::MAX_DEADLINE.0,
    ) {
        let (limiters, _) = play(&s);
        for inner in limiters {
            let locked = Locked { until: Millis(until), inner };
            let valid = lock_follows_denial(&locked);
            let locked = Limiter::Locked(Box::new(locked));
            let bytes = encoded(&locked);
            let back = decode_limiter(&bytes);
            if valid {
                prop_assert!(back.as_ref().is_some_and(|b| same_limiter(b, &locked)), "{:?}", locked);
            } else {
                prop_assert!(back.is_none(), "{:?}", locked);
            }
            check_decoded(&bytes)?;
            let twice = Limiter::Locked(Box::new(Locked { until: Millis(until), inner: locked }));
            prop_assert!(decode_limiter(&encoded(&twice)).is_none());
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn codec_round_trips_limiters_and_effects(
        s in scenario(),
        suffix in vec(any::<u8>(), 1..4),
    ) {
        let (limiters, effects) = play(&s);
        for limiter in &limiters {
            let bytes = encoded(limiter);
            // Anything after a valid encoding is refused.
            let longer = [bytes.as_slice(), &suffix].concat();
            prop_assert_eq!(decode_limiter(&longer), None, "{:?} + {:?}", limiter, suffix);
            prop_assert_eq!(decode_effect(&longer), None, "{:?} + {:?}", limiter, suffix);
            let decoded = decode_limiter(&bytes);
            prop_assert!(
                decoded.as_ref().is_some_and(|d| same_limiter(d, limiter)),
                "{:?} decoded as {:?}", limiter, decoded
            );
            // Decoding then encoding again gives the same bytes.
            prop_assert_eq!(encoded(decoded.as_ref().unwrap()), bytes.clone());
            prop_assert_eq!(decoded.as_ref(), Some(limiter));
        }
        for effect in &effects {
            let bytes = encoded_effect(effect);
            let longer = [bytes.as_slice(), &suffix].concat();
            prop_assert_eq!(decode_effect(&longer), None, "{:?} + {:?}", effect, suffix);
            let decoded = decode_effect(&bytes);
            prop_assert!(
                decoded.as_ref().is_some_and(|d| same_effect(d, effect)),
                "{:?} decoded as {:?}", effect, decoded
            );
        }
    }

    /// Every proper prefix of a valid encoding is refused, a sliding log cut
    /// right after its header included.
    #[test]
    fn codec_refuses_truncations(s in scenario()) {
        let (limiters, effects) = play(&s);
        for limiter in limiters.iter().rev().take(3) {
            let bytes = encoded(limiter);
            for len in 0..bytes.len() {
                prop_assert_eq!(decode_limiter(&bytes[..len]), None, "{:?} cut to {}", limiter, len);
                prop_assert_eq!(decode_effect(&bytes[..len]), None, "{:?} cut to {}", limiter, len);
            }
        }
        for effect in effects.iter().filter(|e| matches!(e, Effect::LogRecord(_))).take(3) {
            let bytes = encoded_effect(effect);
            for len in 0..bytes.len() {
                prop_assert_eq!(decode_effect(&bytes[..len]), None, "{:?} cut to {}", effect, len);
            }
        }
    }

    /// Every stored log (never empty), cut after its header or after any
    /// whole entry short of its count.
    #[test]
    fn codec_refuses_log_cut_after_header(s in scenario()) {
        let (limiters, _) = play(&s);
        for limiter in &limiters {
            let bytes = encoded(limiter);
            let Limiter::SlidingLog(log) = limiter else { continue };
            prop_assert!(bytes.len() > LOG_HEADER, "{:?}", limiter);
            prop_assert_eq!(decode_limiter(&bytes[..LOG_HEADER]), None, "{:?}", limiter);
            // The same log with its newest entries left out, count unchanged.
            let entries: Vec<_> = log.entries().collect();
            for kept in 0..entries.len() {
                let mut previous = 0;
                let pairs = entries[..kept].iter().map(|&(time, count)| {
                    let gap = time.0 - previous;
                    previous = time.0;
                    (gap, count)
                });
                let cut = log_bytes(
                    log.params.limit,
                    log.params.period.0,
                    log.last_update().0,
                    entries.len() as u64,
                    pairs,
                );
                prop_assert_eq!(decode_limiter(&cut), None, "{:?} kept {}", limiter, kept);
            }
        }
    }

    /// `==` on a round-tripped limiter: a sliding log compares by content,
    /// whatever the layout of its buffer.
    #[test]
    fn codec_round_trip_is_equal_by_eq(s in scenario()) {
        let (limiters, _) = play(&s);
        for limiter in &limiters {
            let decoded = decode_limiter(&encoded(limiter));
            prop_assert_eq!(decoded.as_ref(), Some(limiter));
        }
    }

}

proptest! {
    // The decode fuzzers: `make fuzz` runs them with many more cases.
    #![proptest_config(fuzz_config())]

    #[test]
    fn codec_survives_random_bytes(
        junk in prop_oneof![vec(any::<u8>(), 0..80), plausible_bytes(), plausible_log_bytes()],
    ) {
        check_decoded(&junk)?;
    }

    /// Valid encodings with a few bytes changed, cut or extended.
    #[test]
    fn codec_survives_mutations(
        s in scenario(),
        flips in vec((any::<prop::sample::Index>(), 1..=255u8), 1..4),
        cut in any::<prop::sample::Index>(),
        extra in vec(any::<u8>(), 0..4),
    ) {
        let (limiters, effects) = play(&s);
        let mut inputs: Vec<Vec<u8>> = limiters.iter().rev().take(2).map(encoded).collect();
        inputs.extend(effects.iter().rev().take(2).map(encoded_effect));
        for mut bytes in inputs {
            for (at, xor) in &flips {
                let at = at.index(bytes.len());
                bytes[at] ^= xor;
            }
            let len = bytes.len();
            let mut cut_bytes = bytes[..cut.index(len + 1)].to_vec();
            cut_bytes.extend_from_slice(&extra);
            check_decoded(&bytes)?;
            check_decoded(&cut_bytes)?;
        }
    }
}

#[test]
fn codec_log_cut_after_header_minimal() {
    let params = LogParams {
        limit: 1,
        period: Millis(1),
    };
    let mut log = SlidingLog::new(params);
    log.apply(LogRecord {
        params,
        at: Millis(0),
        cost: 1,
    });
    let bytes = encoded(&Limiter::SlidingLog(Box::new(log)));
    // Header with entry count 1, then the entry (time 0, count 1).
    assert_eq!(bytes, log_bytes(1, 1, 0, 1, [(0, 1)]));
    assert_eq!(bytes.len(), LOG_HEADER + 2);
    assert_eq!(decode_limiter(&bytes[..LOG_HEADER]), None);
    assert_eq!(decode_limiter(&bytes[..LOG_HEADER + 1]), None);
    // An empty log is its header with count 0; with the count left at 1 it is cut.
    assert!(decode_limiter(&log_bytes(1, 1, 0, 0, [])).is_some());
    assert_eq!(decode_limiter(&log_bytes(1, 1, 0, 1, [])), None);
    // Fewer or more entries than the count.
    assert_eq!(
        decode_limiter(&log_bytes(1, 10, 1, 3, [(0, 1), (1, 1)])),
        None
    );
    assert_eq!(
        decode_limiter(&log_bytes(1, 10, 1, 1, [(0, 1), (1, 1)])),
        None
    );
    assert!(decode_limiter(&log_bytes(1, 10, 1, 2, [(0, 1), (1, 1)])).is_some());
}

#[test]
fn codec_refuses_overlong_varints() {
    let params = LogParams {
        limit: 1,
        period: Millis(10),
    };
    let mut log = SlidingLog::new(params);
    log.apply(LogRecord {
        params,
        at: Millis(5),
        cost: 1,
    });
    let bytes = encoded(&Limiter::SlidingLog(Box::new(log)));
    assert_eq!(bytes, log_bytes(1, 10, 5, 1, [(5, 1)]));
    assert_eq!(bytes[LOG_HEADER..], [5, 1]);
    // The same entry, its time written as 0x85 0x00 instead of 0x05, or its
    // count as 0x81 0x00 instead of 0x01, or either padded further.
    for entry in [
        &[0x85, 0x00, 0x01][..],
        &[0x05, 0x81, 0x00],
        &[0x85, 0x80, 0x00, 0x01],
        &[0x05, 0x81, 0x80, 0x80, 0x00],
    ] {
        let overlong = [&bytes[..LOG_HEADER], entry].concat();
        assert_eq!(decode_limiter(&overlong), None, "{entry:?}");
    }
    // Multi-byte varints that are minimal are read: time 128, count 300.
    let minimal = log_bytes(1000, 10, 128, 1, [(128, 300)]);
    let Some(Limiter::SlidingLog(decoded)) = decode_limiter(&minimal) else {
        panic!("minimal varints refused");
    };
    assert_eq!(decoded.entries().collect::<Vec<_>>(), [(Millis(128), 300)]);
    // A single zero byte is 0, not overlong: an entry at time 0.
    assert!(decode_limiter(&log_bytes(1, 10, 0, 1, [(0, 1)])).is_some());
}
