//! MEMORY USAGE: small limiters, compact sliding logs.

mod common;

use common::*;

#[test]
fn bucket_and_window_keys_stay_under_100_bytes() {
    let server = Server::start();
    let mut con = server.conn();
    rl(&mut con, &argv!["RL.TOKENBUCKET", "tb", 100, 1, "1h"]);
    rl(&mut con, &argv!["RL.WINDOW", "fw", 100, "1h"]);
    rl(&mut con, &argv!["RL.WINDOW", "sw", 100, "1h", "SLIDING"]);
    for key in ["tb", "fw", "sw"] {
        let usage = int(&q(&mut con, &argv!["MEMORY", "USAGE", key]));
        assert!((48..100).contains(&usage), "{key}: MEMORY USAGE {usage}");
    }
}

/// One logged request, as `rl.apply` carries it (see src/core/codec.rs).
fn log_record(limit: u64, period_ms: u64, at_ms: u64) -> Vec<u8> {
    let mut blob = vec![1u8, 0x80];
    for word in [limit, period_ms, at_ms, 1] {
        blob.extend_from_slice(&word.to_le_bytes());
    }
    blob
}

/// 10,000 requests, each in its own millisecond (built the way a replica
/// builds a log, through rl.apply, since real traffic cannot be spread over
/// an hour in a test): at most 10 bytes an entry, everything included.
#[test]
fn a_sliding_log_of_10000_entries_takes_at_most_10_bytes_each() {
    let server = Server::start();
    let mut con = server.conn();
    let n = 10_000u64;
    let now = server_time_ms(&mut con) as u64;
    let gap = 300; // spread over 50 minutes of a 1 h window
    let start = now - gap * n;
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("RL.APPLY")
            .arg("log")
            .arg(log_record(n, 3_600_000, start + i * gap))
            .ignore();
    }
    pipe.query::<()>(&mut con).expect("rl.apply pipeline");
    let peek = rl(&mut con, &argv!["RL.SLIDINGLOG", "log", n, "1h", "COST", 0]);
    assert_eq!(
        peek.remaining, 0,
        "the log should hold {n} requests: {peek:?}"
    );
    let usage = int(&q(&mut con, &argv!["MEMORY", "USAGE", "log"])) as u64;
    assert!(usage <= 10 * n, "MEMORY USAGE {usage} for {n} entries");
    // And it stays exact: one more is denied until the oldest leaves.
    let denied = rl(&mut con, &argv!["RL.SLIDINGLOG", "log", n, "1h"]);
    assert!(!denied.allowed, "{denied:?}");
    // The oldest entry (50 minutes old in a 1 h window) leaves in 10 minutes.
    assert!(
        (590_000..=600_000).contains(&denied.retry_after),
        "{denied:?}"
    );
}
