//! Window edges. Each burst runs in one MULTI/EXEC that starts with TIME, so
//! the test knows the exact time the module decided at and every assertion is
//! exact for that time; timing luck only decides whether an attempt shows the
//! interesting case (a burst just before an edge and one just after), and a
//! few attempts are made until one does.

mod common;

use common::*;
use redis::Connection;

const PERIOD: i64 = 1000;
const ATTEMPTS: usize = 8;

/// `n` copies of `cmd` plus a PTTL of `key`, at one server time.
fn burst(con: &mut Connection, cmd: &[String], key: &str, n: usize) -> (i64, Vec<Reply>, i64) {
    let mut cmds = vec![cmd.to_vec(); n];
    cmds.push(argv!["PTTL", key]);
    let (t, items) = timed(con, &cmds);
    let replies = items[..n].iter().map(Reply::parse).collect();
    (t, replies, int(&items[n]))
}

/// Sleeps until `before` ms before a window edge at least 250 ms away; returns the edge.
fn approach_edge(con: &mut Connection, before: i64) -> i64 {
    let now = server_time_ms(con);
    let mut edge = (now / PERIOD + 1) * PERIOD;
    if edge - now < before + 70 {
        edge += PERIOD;
    }
    sleep_until_server_ms(con, edge - before);
    edge
}

#[test]
fn fixed_window_allows_a_burst_on_each_side_of_an_edge() {
    let server = Server::start();
    let mut con = server.conn();
    let limit = 5usize;
    for attempt in 0..ATTEMPTS {
        let key = format!("fw:{attempt}");
        let cmd = argv!["RL.WINDOW", &key, limit, format!("{PERIOD}ms")];
        approach_edge(&mut con, 180);
        let (t1, first, ttl1) = burst(&mut con, &cmd, &key, limit + 1);
        // Windows are aligned to multiples of the period since the epoch.
        let end1 = (t1 / PERIOD + 1) * PERIOD;
        for (i, r) in first.iter().enumerate().take(limit) {
            assert!(
                r.allowed,
                "request {} of the first burst at {t1}: {r:?}",
                i + 1
            );
            assert_eq!(r.remaining, (limit - 1 - i) as i64);
            assert_eq!(
                r.reset_after,
                end1 - t1,
                "reset_after = time to the window end at {t1}"
            );
        }
        let denied = first[limit];
        assert!(
            !denied.allowed,
            "request {} in one window: {denied:?}",
            limit + 1
        );
        assert_eq!(
            denied.retry_after,
            end1 - t1,
            "retry when the window ends: {denied:?} at {t1}"
        );
        assert_eq!(
            ttl1,
            end1 - t1,
            "the key expires when the window ends (PTTL at {t1})"
        );

        sleep_until_server_ms(&mut con, end1 + 15);
        let (t2, second, ttl2) = burst(&mut con, &cmd, &key, limit + 1);
        assert!(t2 >= end1);
        let end2 = (t2 / PERIOD + 1) * PERIOD;
        for (i, r) in second.iter().enumerate().take(limit) {
            assert!(
                r.allowed,
                "fixed window: request {} right after the edge at {end1} (t={t2}, first burst at {t1}) denied: {r:?}",
                i + 1
            );
            assert_eq!(
                r.remaining,
                (limit - 1 - i) as i64,
                "a new window starts empty"
            );
        }
        assert!(!second[limit].allowed);
        assert_eq!(second[limit].retry_after, end2 - t2);
        assert_eq!(ttl2, end2 - t2);

        if end1 - t1 <= 250 && t2 - t1 < PERIOD {
            return; // 2*limit allowed within less than one period: the fixed-window edge burst.
        }
        eprintln!("attempt {attempt}: timing off (t1={t1}, end1={end1}, t2={t2}), retrying");
    }
    panic!("no attempt got both bursts within one period of each other (machine too slow?)");
}

#[test]
fn sliding_log_denies_the_second_burst_after_an_edge() {
    let server = Server::start();
    let mut con = server.conn();
    let limit = 5usize;
    for attempt in 0..ATTEMPTS {
        let key = format!("sl:{attempt}");
        let cmd = argv!["RL.SLIDINGLOG", &key, limit, format!("{PERIOD}ms")];
        let edge = approach_edge(&mut con, 180);
        let (t1, first, ttl1) = burst(&mut con, &cmd, &key, limit + 1);
        for (i, r) in first.iter().enumerate().take(limit) {
            assert!(r.allowed, "request {} of the first burst: {r:?}", i + 1);
            assert_eq!(r.remaining, (limit - 1 - i) as i64);
            assert_eq!(
                r.reset_after, PERIOD,
                "the log empties one period after its newest entry"
            );
        }
        let denied = first[limit];
        assert!(!denied.allowed, "{denied:?}");
        assert_eq!(
            denied.retry_after, PERIOD,
            "all entries at {t1}: the first leaves after one period"
        );
        assert_eq!(ttl1, PERIOD, "the key expires when its newest entry leaves");

        let wake = edge.max(t1 + 1) + 15;
        sleep_until_server_ms(&mut con, wake);
        let (t2, second, ttl2) = burst(&mut con, &cmd, &key, limit + 1);
        if t2 < t1 + PERIOD {
            for r in &second {
                assert!(
                    !r.allowed,
                    "sliding log: request at {t2}, {} ms after a full burst at {t1} (period {PERIOD}), allowed: {r:?}",
                    t2 - t1
                );
                assert_eq!(r.remaining, 0);
                assert_eq!(r.retry_after, t1 + PERIOD - t2, "{r:?}");
                assert_eq!(r.reset_after, t1 + PERIOD - t2, "{r:?}");
            }
            assert_eq!(ttl2, t1 + PERIOD - t2, "denials do not move the expiry");
            if t1 < edge && t2 >= edge {
                return;
            }
        } else {
            // Too slow: the first burst has left the log, all fits again.
            assert!(second[..limit].iter().all(|r| r.allowed), "{second:?}");
        }
        eprintln!("attempt {attempt}: timing off (t1={t1}, edge={edge}, t2={t2}), retrying");
    }
    panic!("no attempt placed the bursts on both sides of an edge within one period");
}

/// How many of `n` requests of cost 1 a sliding window counter allows at
/// `elapsed` ms into a window, with `previous` and `current` counted.
fn sliding_allowed(limit: i64, previous: i64, mut current: i64, elapsed: i64, n: usize) -> usize {
    let weighted = previous * (PERIOD - elapsed.min(PERIOD));
    let mut allowed = 0;
    for _ in 0..n {
        if weighted + (current + 1) * PERIOD <= limit * PERIOD {
            current += 1;
            allowed += 1;
        }
    }
    allowed
}

#[test]
fn sliding_window_weighs_the_previous_window() {
    let server = Server::start();
    let mut con = server.conn();
    let limit = 10usize;
    for attempt in 0..ATTEMPTS {
        let key = format!("sw:{attempt}");
        let cmd = argv!["RL.WINDOW", &key, limit, format!("{PERIOD}ms"), "SLIDING"];
        approach_edge(&mut con, 180);
        let (t1, first, ttl1) = burst(&mut con, &cmd, &key, limit + 1);
        let end1 = (t1 / PERIOD + 1) * PERIOD;
        assert!(first[..limit].iter().all(|r| r.allowed), "{first:?}");
        assert!(!first[limit].allowed, "{first:?}");
        let expire = end1 + PERIOD - t1;
        assert_eq!(
            first[limit - 1].reset_after,
            expire,
            "counted requests weigh until the end of the next window"
        );
        assert_eq!(ttl1, expire, "PTTL at {t1}");

        // Just after the edge: the previous window still weighs almost fully.
        sleep_until_server_ms(&mut con, end1 + 10);
        let (t2, second, _) = burst(&mut con, &cmd, &key, limit);
        let mut current = 0i64;
        if t2 < end1 + PERIOD {
            let elapsed = t2 - end1;
            let expect = sliding_allowed(limit as i64, limit as i64, 0, elapsed, limit);
            let got = second.iter().filter(|r| r.allowed).count();
            assert_eq!(
                got, expect,
                "sliding window at {elapsed} ms into the window after a full one (limit {limit}): {second:?}"
            );
            assert!(
                second[..got].iter().all(|r| r.allowed),
                "allowed ones come first: {second:?}"
            );
            current = got as i64;

            // Later in the same window, more fits as the previous one slides out.
            sleep_until_server_ms(&mut con, end1 + 600);
            let (t3, third, _) = burst(&mut con, &cmd, &key, limit);
            if t3 < end1 + PERIOD {
                let elapsed = t3 - end1;
                let expect = sliding_allowed(limit as i64, limit as i64, current, elapsed, limit);
                let got = third.iter().filter(|r| r.allowed).count();
                assert_eq!(
                    got, expect,
                    "at {elapsed} ms with {current} already counted: {third:?}"
                );
                if t1 >= end1 - 250 && t2 - end1 < 100 {
                    // Right after a full window, where a fixed window would
                    // allow a full burst, the counter allowed only what the
                    // weighting permits.
                    return;
                }
            }
        }
        eprintln!("attempt {attempt}: timing off (t1={t1}, end1={end1}, t2={t2}, counted {current}), retrying");
    }
    panic!("no attempt got the timing needed");
}
