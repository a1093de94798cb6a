//! Many clients at once on one key: exactly `limit` requests get through.

mod common;

use common::*;
use std::sync::{Arc, Barrier};
use std::thread;

const THREADS: usize = 16;
const LIMIT: u64 = 200;

/// Fires 2*limit requests of `cost` from THREADS connections released together.
fn hammer(server: &Server, cmd: Vec<String>, per_thread: usize) -> Vec<Reply> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let mut con = server.conn();
            let barrier = Arc::clone(&barrier);
            let cmd = cmd.clone();
            thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|_| rl(&mut con, &cmd))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("client thread panicked"))
        .collect()
}

fn check_exactly_limit(algo: Algo, replies: &[Reply], limit: u64, cost: u64) {
    let allowed: Vec<&Reply> = replies.iter().filter(|r| r.allowed).collect();
    assert_eq!(
        allowed.len() as u64,
        limit / cost,
        "{}: {} requests of cost {cost} against limit {limit}: {} allowed",
        algo.name(),
        replies.len(),
        allowed.len()
    );
    // Every allowed request saw a distinct remaining value: the decisions
    // were serialised, none saw a stale count.
    let mut remaining: Vec<i64> = allowed.iter().map(|r| r.remaining).collect();
    remaining.sort_unstable();
    let expected: Vec<i64> = (0..limit / cost)
        .map(|i| (limit - cost * (i + 1)) as i64)
        .rev()
        .collect();
    assert_eq!(
        remaining,
        expected,
        "{}: remaining values of the allowed requests",
        algo.name()
    );
    for r in replies.iter().filter(|r| !r.allowed) {
        assert_eq!(
            r.remaining as u64,
            limit % cost,
            "{}: denied reply {r:?}",
            algo.name()
        );
        assert!(r.retry_after > 0, "{}: denied reply {r:?}", algo.name());
    }
}

fn run(algo: Algo, cost: u64) {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 120_000);
    let key = format!("conc:{algo:?}");
    let cmd = algo.cmd_with(&key, LIMIT, "1h", &["COST", &cost.to_string()]);
    let total = 2 * LIMIT as usize / cost as usize;
    let replies = hammer(&server, cmd, total.div_ceil(THREADS));
    check_exactly_limit(algo, &replies, LIMIT, cost);
    // And the stored state agrees: nothing more fits.
    let r = rl(&mut con, &algo.cmd_with(&key, LIMIT, "1h", &["DRYRUN"]));
    assert!(
        !r.allowed && r.remaining == 0,
        "{}: after the storm {r:?}",
        algo.name()
    );
}

#[test]
fn token_bucket_concurrent() {
    run(Algo::TokenBucket, 1);
}

#[test]
fn fixed_window_concurrent() {
    run(Algo::FixedWindow, 1);
}

#[test]
fn sliding_window_concurrent() {
    run(Algo::SlidingWindow, 1);
}

#[test]
fn sliding_log_concurrent() {
    run(Algo::SlidingLog, 1);
}

#[test]
fn sliding_log_countdenied_concurrent() {
    // Denied requests are logged too, but the allowed count is still exact.
    let server = Server::start();
    let key = "conc:countdenied";
    let cmd = argv!["RL.SLIDINGLOG", key, LIMIT, "1h", "COUNTDENIED"];
    let replies = hammer(&server, cmd, 2 * LIMIT as usize / THREADS);
    check_exactly_limit(Algo::SlidingLog, &replies, LIMIT, 1);
}

#[test]
fn all_algorithms_with_cost_concurrent() {
    // Cost 8 into 200: 25 fit, each leaving a distinct multiple of 8.
    for algo in Algo::ALL {
        run(algo, 8);
    }
}

/// Many keys at once from many clients: each key's count is exact.
#[test]
fn many_keys_concurrent() {
    let server = Server::start();
    let mut con = server.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 120_000);
    const KEYS: usize = 8;
    const PER_KEY_LIMIT: u64 = 30;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let mut con = server.conn();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                let mut allowed = [0u64; KEYS];
                for i in 0..(KEYS * PER_KEY_LIMIT as usize * 2 / THREADS * 2) {
                    let k = (i + t) % KEYS;
                    let algo = Algo::ALL[k % Algo::ALL.len()];
                    let r = rl(
                        &mut con,
                        &algo.cmd(&format!("many:{k}"), PER_KEY_LIMIT, "1h"),
                    );
                    allowed[k] += u64::from(r.allowed);
                }
                allowed
            })
        })
        .collect();
    let mut totals = [0u64; KEYS];
    for h in handles {
        for (k, n) in h.join().expect("client thread").iter().enumerate() {
            totals[k] += n;
        }
    }
    for (k, total) in totals.iter().enumerate() {
        assert_eq!(
            *total,
            PER_KEY_LIMIT,
            "key many:{k} ({})",
            Algo::ALL[k % Algo::ALL.len()].name()
        );
    }
}
