//! retry_after_ms and reset_after_ms are exact: waiting retry_after_ms is
//! enough, and keys expire when their limiter is back to full.
//!
//! Decisions are made at a time read in the same MULTI/EXEC (TIME comes
//! first), so the expected values are computed exactly for that time and a
//! slow machine cannot make an assertion fail; it can only make the test
//! take longer.

mod common;

use common::*;
use redis::Connection;
use std::thread::sleep;
use std::time::Duration;

/// Probes with `dry` (a DRYRUN command) around `ready`, the announced retry
/// time: every probe before it must be denied and point at the same time,
/// the first one at or after it must be allowed.
fn probe_until_allowed(con: &mut Connection, dry: &[String], ready: i64) {
    sleep_until_server_ms(con, ready - 30);
    let mut probes = 0;
    loop {
        probes += 1;
        let (t, r) = timed_rl(con, dry);
        if t < ready {
            assert!(
                !r.allowed,
                "{dry:?} at {t}, {} ms before the announced retry time {ready}, was allowed: {r:?}",
                ready - t
            );
            assert_eq!(
                t + r.retry_after,
                ready,
                "{dry:?} at {t}: retry_after_ms {} names another time than {ready}",
                r.retry_after
            );
        } else {
            assert!(
                r.allowed,
                "{dry:?} at {t}, {} ms after the announced retry time {ready}, was denied: {r:?} ({probes} probes)",
                t - ready
            );
            return;
        }
    }
}

/// Exhausts `cmd` (limit requests of cost 1) in one MULTI; returns the time and
/// the denial that follows.
fn exhaust(con: &mut Connection, cmd: &[String], limit: usize) -> (i64, Reply) {
    let (t, items) = timed(con, &vec![cmd.to_vec(); limit + 1]);
    let replies: Vec<Reply> = items.iter().map(Reply::parse).collect();
    assert!(
        replies[..limit].iter().all(|r| r.allowed),
        "{cmd:?} at {t}: {replies:?}"
    );
    let denied = replies[limit];
    assert!(
        !denied.allowed && denied.retry_after > 0,
        "{cmd:?} at {t}: {denied:?}"
    );
    (t, denied)
}

fn with(cmd: &[String], options: &[&str]) -> Vec<String> {
    let mut cmd = cmd.to_vec();
    cmd.extend(options.iter().map(|s| s.to_string()));
    cmd
}

#[test]
fn token_bucket_retry_after_is_exact() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "tb", 3, 1, "400ms"];
    let (t, denied) = exhaust(&mut con, &cmd, 3);
    assert_eq!(denied.retry_after, 400, "one token per 400 ms: {denied:?}");
    assert_eq!(
        denied.reset_after, 1200,
        "three tokens to refill: {denied:?}"
    );
    probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), t + 400);
    let (t1, r) = timed_rl(&mut con, &cmd);
    assert!(
        r.allowed,
        "at {t1}, after the retry time {}: {r:?}",
        t + 400
    );
    // Two tokens wanted: the wait covers both (unless the machine stalled
    // long enough for them to be there already).
    let cost2 = with(&cmd, &["COST", "2"]);
    let (t2, r) = timed_rl(&mut con, &cost2);
    if !r.allowed {
        assert!(
            r.retry_after > 0 && r.retry_after <= 800,
            "two tokens at 1 per 400 ms (t1={t1}, t2={t2}): {r:?}"
        );
        probe_until_allowed(&mut con, &with(&cost2, &["DRYRUN"]), t2 + r.retry_after);
        let (_, r) = timed_rl(&mut con, &cost2);
        assert!(r.allowed, "{r:?}");
    }
    // More than the capacity: never.
    let r = rl(&mut con, &with(&cmd, &["COST", "4"]));
    assert_eq!((r.allowed, r.retry_after), (false, -1), "{r:?}");
}

#[test]
fn fixed_window_retry_after_is_exact() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.WINDOW", "fw", 3, "700ms"];
    let (t, denied) = exhaust(&mut con, &cmd, 3);
    let end = (t / 700 + 1) * 700;
    assert_eq!(denied.retry_after, end - t, "at {t}: {denied:?}");
    probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), end);
    let (_, r) = timed_rl(&mut con, &cmd);
    assert!(r.allowed, "{r:?}");
    let r = rl(&mut con, &with(&cmd, &["COST", "4"]));
    assert_eq!((r.allowed, r.retry_after), (false, -1), "{r:?}");
}

/// The first time at or after `from` a sliding window counter (limit, period)
/// whose window starting at `start` holds `current` (and nothing before) lets
/// `cost` through.
fn sliding_ready(start: i64, current: i64, limit: i64, period: i64, cost: i64, from: i64) -> i64 {
    (from..from + 3 * period)
        .find(|&t| {
            let (previous, current, window_start) = if t < start + period {
                (0, current, start)
            } else if t < start + 2 * period {
                (current, 0, start + period)
            } else {
                (0, 0, t)
            };
            let elapsed = t - window_start;
            previous * (period - elapsed) + (current + cost) * period <= limit * period
        })
        .expect("ready within three periods")
}

#[test]
fn sliding_window_retry_after_is_exact() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.WINDOW", "sw", 3, "700ms", "SLIDING"];
    let (t, denied) = exhaust(&mut con, &cmd, 3);
    let start = t / 700 * 700;
    let ready = sliding_ready(start, 3, 3, 700, 1, t);
    assert_eq!(
        t + denied.retry_after,
        ready,
        "3 counted at {t} in the window from {start}: estimate+1 <= 3 first at {ready}; got {denied:?}"
    );
    probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), ready);
    let (_, r) = timed_rl(&mut con, &cmd);
    assert!(r.allowed, "{r:?}");
    let r = rl(&mut con, &with(&cmd, &["COST", "4"]));
    assert_eq!((r.allowed, r.retry_after), (false, -1), "{r:?}");
}

#[test]
fn sliding_log_retry_after_is_exact() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.SLIDINGLOG", "sl", 3, "700ms"];
    // Three entries at distinct times.
    let mut times = Vec::new();
    for _ in 0..3 {
        let (t, r) = timed_rl(&mut con, &cmd);
        assert!(r.allowed, "{r:?}");
        times.push(t);
        sleep(Duration::from_millis(60));
    }
    let (t, r) = timed_rl(&mut con, &cmd);
    assert!(!r.allowed, "{r:?}");
    if t < times[0] + 700 {
        assert_eq!(
            t + r.retry_after,
            times[0] + 700,
            "the oldest entry (at {}) leaves first: {r:?}",
            times[0]
        );
        probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), times[0] + 700);
    }
    // Now one slot is free; taking it, the next one frees when the second entry leaves.
    let (t4, r) = timed_rl(&mut con, &cmd);
    assert!(r.allowed, "at {t4}, entries at {times:?}: {r:?}");
    let (t5, r) = timed_rl(&mut con, &cmd);
    if t5 < times[1] + 700 {
        assert!(!r.allowed, "{r:?}");
        assert_eq!(
            t5 + r.retry_after,
            times[1] + 700,
            "entries {times:?} and {t4}: {r:?}"
        );
        // COST 2 waits for two entries to leave: the second and the third.
        let (t6, r) = timed_rl(&mut con, &with(&cmd, &["COST", "2"]));
        if t6 < times[2] + 700 {
            assert!(!r.allowed, "{r:?}");
            assert_eq!(
                t6 + r.retry_after,
                times[2] + 700,
                "entries {times:?}, {t4}: {r:?}"
            );
        }
    }
    let r = rl(&mut con, &with(&cmd, &["COST", "4"]));
    assert_eq!((r.allowed, r.retry_after), (false, -1), "{r:?}");
}

/// The plain client loop: read retry_after_ms from a denial, sleep that
/// long (plus 2 ms), ask again: allowed. For every algorithm, a few rounds.
#[test]
fn sleeping_retry_after_is_enough() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        let key = format!("loop:{algo:?}");
        let cmd = match algo {
            Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, 2, 1, "300ms"],
            _ => algo.cmd(&key, 2, "300ms"),
        };
        let mut rounds = 0;
        let mut denials = 0;
        while rounds < 4 {
            let r = rl(&mut con, &cmd);
            if r.allowed {
                continue;
            }
            denials += 1;
            assert!(denials < 20, "{}: never allowed again", algo.name());
            assert!(
                r.retry_after > 0 && r.retry_after <= 600,
                "{}: {r:?}",
                algo.name()
            );
            sleep(Duration::from_millis(r.retry_after as u64 + 2));
            let again = rl(&mut con, &cmd);
            assert!(
                again.allowed,
                "{}: slept retry_after_ms={} (+2 ms) after {r:?}, then denied: {again:?}",
                algo.name(),
                r.retry_after
            );
            rounds += 1;
        }
    }
}

/// The expected reset_after_ms of a first request of cost 1 at `t`.
fn first_reset(algo: Algo, t: i64, period: i64, limit: i64) -> i64 {
    match algo {
        // A bucket of `limit` refilling `limit` per period misses one token.
        Algo::TokenBucket => (period + limit - 1) / limit,
        Algo::FixedWindow => period - t % period,
        Algo::SlidingWindow => 2 * period - t % period,
        Algo::SlidingLog => period,
        // One request per period on the schedule.
        Algo::Gcra => period,
    }
}

#[test]
fn keys_expire_when_back_to_full() {
    let server = Server::start();
    let mut con = server.conn();
    let period = 300;
    let limit = 4;
    let mut waits = Vec::new();
    for algo in Algo::ALL {
        let key = format!("exp:{algo:?}");
        let cmd = match algo {
            Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, limit, limit, format!("{period}ms")],
            _ => algo.cmd(&key, limit as u64, &format!("{period}ms")),
        };
        let (t, items) = timed(
            &mut con,
            &[cmd.clone(), argv!["PTTL", &key], argv!["PEXPIRETIME", &key]],
        );
        let r = Reply::parse(&items[0]);
        assert!(r.allowed);
        assert_eq!(
            r.reset_after,
            first_reset(algo, t, period, limit),
            "{} at {t}: {r:?}",
            algo.name()
        );
        let ttl = int(&items[1]);
        assert!(ttl > 0, "{}: PTTL {ttl}", algo.name());
        assert!(
            ttl <= r.reset_after && ttl >= r.reset_after - 2,
            "{}: PTTL {ttl} in the same MULTI as reset_after_ms {}",
            algo.name(),
            r.reset_after
        );
        let at = int(&items[2]);
        assert!(
            (at - (t + r.reset_after)).abs() <= 2,
            "{}: expires at {at}, back to full at {}",
            algo.name(),
            t + r.reset_after
        );
        // A later PTTL is no more than reset_after_ms.
        let later = pttl(&mut con, &key);
        assert!(
            later <= r.reset_after,
            "{}: PTTL {later} > reset_after_ms {}",
            algo.name(),
            r.reset_after
        );
        waits.push((key, t + r.reset_after));
    }
    for (key, full_at) in waits {
        sleep_until_server_ms(&mut con, full_at + 30);
        assert!(
            !exists(&mut con, &key),
            "{key} should have expired at {full_at}"
        );
    }
}

/// Each allowed request moves the expiry to the new full time; a denied one
/// leaves it where it is.
#[test]
fn expiry_follows_the_state() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        let key = format!("follow:{algo:?}");
        let cmd = match algo {
            Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, 3, 1, "5s"],
            _ => algo.cmd(&key, 3, "5s"),
        };
        let mut last_expire = 0;
        for i in 0..5 {
            let (t, items) = timed(&mut con, &[cmd.clone(), argv!["PEXPIRETIME", &key]]);
            let r = Reply::parse(&items[0]);
            let at = int(&items[1]);
            assert!(
                at > t,
                "{}: expiry {at} not in the future of {t}",
                algo.name()
            );
            assert!(
                (at - (t + r.reset_after)).abs() <= 2,
                "{}: expiry {at} vs {t}+{}",
                algo.name(),
                r.reset_after
            );
            if r.allowed {
                assert!(at >= last_expire, "{}: expiry moved backwards", algo.name());
            } else {
                assert_eq!(
                    at,
                    last_expire,
                    "{}: a denied request (#{}) moved the expiry",
                    algo.name(),
                    i + 1
                );
            }
            last_expire = at;
            sleep(Duration::from_millis(15));
        }
    }
}

/// An odd refill rate: 3 tokens per second, one token every 333.3 ms. The
/// waits round up to whole milliseconds and are never too short.
#[test]
fn token_bucket_odd_rate_retry_after() {
    let server = Server::start();
    let mut con = server.conn();
    let cmd = argv!["RL.TOKENBUCKET", "odd", 10, 3, "1s"];
    let (t, denied) = exhaust(&mut con, &cmd, 10);
    assert_eq!(
        denied.retry_after, 334,
        "ceil(1000/3) ms for one token: {denied:?}"
    );
    assert_eq!(
        denied.reset_after, 3334,
        "ceil(10000/3) ms for ten tokens: {denied:?}"
    );
    probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), t + 334);
    for _ in 0..3 {
        let (t1, r) = timed_rl(&mut con, &cmd);
        if r.allowed {
            continue;
        }
        probe_until_allowed(&mut con, &with(&cmd, &["DRYRUN"]), t1 + r.retry_after);
        let (_, r) = timed_rl(&mut con, &cmd);
        assert!(r.allowed, "{r:?}");
    }
}
