//! Counts near u64::MAX: window and log counts at and beyond the largest
//! limit, in decisions and in the codec.

use super::{encoded, exercise, log_bytes};
use crate::core::codec::decode_limiter;
use crate::core::limiter::Limiter;
use crate::core::sliding_log::{self, LogParams, SlidingLog};
use crate::core::window::{self, Window, WindowParams};
use crate::core::{Millis, RetryAfter, MAX_COUNT};

// ---------------------------------------------------------------------------
// Counts near u64::MAX.

#[test]
fn sliding_log_count_denied_total_never_wraps() {
    let params = LogParams {
        limit: MAX_COUNT,
        period: Millis(1000),
    };
    let mut log: Option<SlidingLog> = None;
    for i in 0..20_000 {
        let (out, record) = sliding_log::decide(log.as_ref(), params, Millis(0), MAX_COUNT, true);
        // Everything is logged at 0 and leaves the window at 1000.
        assert_eq!(out.allowed, i == 0, "request {i}: {out:?}");
        assert_eq!(out.remaining, 0, "request {i}: {out:?}");
        if i > 0 {
            assert_eq!(
                out.retry_after,
                RetryAfter::After(Millis(1000)),
                "request {i}"
            );
        }
        assert_eq!(out.reset_after, Millis(1000), "request {i}: {out:?}");
        if let Some(record) = record {
            log.get_or_insert_with(|| SlidingLog::new(params))
                .apply(record);
        }
    }
    let log = log.unwrap();
    // One entry, capped at limit + 1, so the log can be stored and reloaded.
    let limiter = Limiter::SlidingLog(Box::new(log.clone()));
    assert_eq!(decode_limiter(&encoded(&limiter)), Some(limiter));
    assert!(
        sliding_log::decide(Some(&log), params, Millis(1000), MAX_COUNT, true)
            .0
            .allowed
    );
}

/// A window count is at most the largest limit: a count up to it (written
/// under a larger limit) is accepted and decided on, anything above refused.
#[test]
fn codec_refuses_window_count_beyond_max_count() {
    let window = |previous: u64, current: u64| Window {
        params: WindowParams {
            limit: 10,
            period: Millis(1000),
        },
        start: Millis(0),
        previous,
        current,
    };
    for (previous, current) in [
        (0, u64::MAX),
        (0, MAX_COUNT + 1),
        (u64::MAX, 0),
        (MAX_COUNT + 1, 0),
        (MAX_COUNT + 1, MAX_COUNT + 1),
    ] {
        let w = window(previous, current);
        assert_eq!(
            decode_limiter(&encoded(&Limiter::SlidingWindow(w))),
            None,
            "{w:?}"
        );
        assert_eq!(
            decode_limiter(&encoded(&Limiter::FixedWindow(w))),
            None,
            "{w:?}"
        );
    }
    // A fixed window has no previous count.
    let w = window(1, 0);
    assert_eq!(decode_limiter(&encoded(&Limiter::FixedWindow(w))), None);

    let w = window(MAX_COUNT, MAX_COUNT);
    let Some(Limiter::SlidingWindow(decoded)) =
        decode_limiter(&encoded(&Limiter::SlidingWindow(w)))
    else {
        panic!("counts of MAX_COUNT refused");
    };
    assert_eq!(decoded, w);
    // Current MAX_COUNT in [0, 1000) weighs more than 9 (room for cost 1 of
    // 10) until its weight is 0 at 2000.
    let (out, _) = window::decide(Some(&decoded), decoded.params, true, Millis(0), 1);
    assert!(!out.allowed);
    assert_eq!(out.remaining, 0);
    assert_eq!(out.retry_after, RetryAfter::After(Millis(2000)));
    assert_eq!(out.reset_after, Millis(2000));
    let (out, _) = window::decide(Some(&decoded), decoded.params, true, Millis(1999), 1);
    assert!(!out.allowed);
    assert_eq!(out.retry_after, RetryAfter::After(Millis(1)));
    assert!(
        window::decide(Some(&decoded), decoded.params, true, Millis(2000), 10)
            .0
            .allowed
    );

    let w = window(0, MAX_COUNT);
    let Some(Limiter::FixedWindow(decoded)) = decode_limiter(&encoded(&Limiter::FixedWindow(w)))
    else {
        panic!("a count of MAX_COUNT refused");
    };
    let (out, _) = window::decide(Some(&decoded), decoded.params, false, Millis(0), 1);
    assert!(!out.allowed);
    assert_eq!(out.retry_after, RetryAfter::After(Millis(1000)));
    assert!(
        window::decide(Some(&decoded), decoded.params, false, Millis(1000), 10)
            .0
            .allowed
    );
}

/// A log entry's count is at most the largest limit + 1 (the cap of an entry
/// written under the largest limit), and the total fits in a u64.
#[test]
fn codec_refuses_log_count_beyond_any_limit() {
    let params = LogParams {
        limit: 10,
        period: Millis(1000),
    };
    for count in [u64::MAX, MAX_COUNT + 2] {
        assert!(SlidingLog::from_entries(params, Millis(0), [(Millis(0), count)]).is_none());
        assert_eq!(
            decode_limiter(&log_bytes(10, 1000, 0, 1, [(0, count)])),
            None,
            "{count}"
        );
    }
    // The largest count any limit writes is accepted, kept as it is, and
    // denies everything while it is live.
    let log = SlidingLog::from_entries(params, Millis(0), [(Millis(0), MAX_COUNT + 1)]).unwrap();
    let bytes = log_bytes(10, 1000, 0, 1, [(0, MAX_COUNT + 1)]);
    assert_eq!(encoded(&Limiter::SlidingLog(Box::new(log.clone()))), bytes);
    let Some(Limiter::SlidingLog(mut decoded)) = decode_limiter(&bytes) else {
        panic!("a count of MAX_COUNT + 1 refused");
    };
    assert_eq!(*decoded, log);
    assert_eq!(
        decoded.entries().collect::<Vec<_>>(),
        [(Millis(0), MAX_COUNT + 1)]
    );
    for count_denied in [false, true] {
        let (out, record) = sliding_log::decide(Some(&decoded), params, Millis(0), 1, count_denied);
        assert!(!out.allowed, "{out:?}");
        assert_eq!(out.remaining, 0);
        assert_eq!(out.retry_after, RetryAfter::After(Millis(1000)));
        assert_eq!(out.reset_after, Millis(1000));
        assert_eq!(record.is_some(), count_denied);
        if let Some(record) = record {
            // Logged in the same millisecond: still denied until 1000.
            decoded.apply(record);
            let (out, _) = sliding_log::decide(Some(&decoded), params, Millis(999), 10, false);
            assert!(!out.allowed);
            assert_eq!(out.retry_after, RetryAfter::After(Millis(1)));
            assert!(
                sliding_log::decide(Some(&decoded), params, Millis(1000), 10, false)
                    .0
                    .allowed
            );
        }
    }

    // Entries of MAX_COUNT + 1 at 0, 1, 2, ...: 18_446 of them fit in a u64,
    // 18_447 do not.
    let big = MAX_COUNT + 1;
    let many = |n: u64| {
        log_bytes(
            10,
            1_000_000,
            n - 1,
            n,
            (0..n).map(|i| (u64::from(i > 0), big)),
        )
    };
    // More than one entry above the limit is a log `apply` never leaves (it
    // drops the oldest while the newer ones exceed the limit): refused, which
    // also keeps every total far below u64::MAX.
    for n in [2, 18_446, 18_447] {
        assert_eq!(
            decode_limiter(&many(n)),
            None,
            "{n} entries of MAX_COUNT + 1"
        );
    }
    let Some(Limiter::SlidingLog(one)) = decode_limiter(&many(1)) else {
        panic!("a single entry of MAX_COUNT + 1 refused");
    };
    let (out, _) = sliding_log::decide(Some(&one), one.params, Millis(0), 1, false);
    assert!(!out.allowed);
    assert_eq!(out.retry_after, RetryAfter::After(Millis(1_000_000)));
    exercise(&Limiter::SlidingLog(one));
}

/// A log whose total is near u64::MAX (entries after the oldest far above the
/// limit) is one `apply` never produces: decode refuses it.
#[test]
fn codec_refuses_a_log_total_near_u64_max() {
    let big = MAX_COUNT + 1;
    let k = 18_446u64;
    let medium = u64::MAX - 1 - 3 - k * big;
    let entries = (0..k)
        .map(|i| (u64::from(i > 0), big))
        .chain([(1, medium), (1, 3)]);
    assert_eq!(
        decode_limiter(&log_bytes(10, 1_000_000, k + 1, k + 2, entries)),
        None
    );
}
