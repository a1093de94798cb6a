//! Property test against a real server: within one period (no refill, no
//! window change) every algorithm is a budget of `limit`, and random
//! sequences of costs, DRYRUNs and COST 0 must follow that model exactly.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::RefCell;

#[derive(Clone, Debug)]
struct Op {
    cost: u64,
    dry: bool,
}

fn ops(limit: u64) -> impl Strategy<Value = Vec<Op>> {
    let cost = prop_oneof![
        3 => Just(1u64),
        1 => Just(0u64),
        2 => 0..=limit + 2,
        1 => Just(limit),
    ];
    prop::collection::vec(
        (cost, prop::bool::weighted(0.2)).prop_map(|(cost, dry)| Op { cost, dry }),
        1..40,
    )
}

fn run_model(algo: Algo, counted: bool) {
    let server = Server::start();
    let con = RefCell::new(server.conn());
    avoid_boundary(&mut con.borrow_mut(), ONE_HOUR_MS, 300_000);
    let case = RefCell::new(0u64);
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (1u64..30).prop_flat_map(|limit| (Just(limit), ops(limit)));
    let result = runner.run(&strategy, |(limit, ops)| {
        let mut con = con.borrow_mut();
        let n = {
            let mut c = case.borrow_mut();
            *c += 1;
            *c
        };
        let key = format!("model:{n}");
        let mut used = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let mut cmd = match algo {
                Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, limit, 1, "3650d"],
                _ => algo.cmd(&key, limit, "1h"),
            };
            cmd.extend(argv!["COST", op.cost]);
            if op.dry {
                cmd.push("DRYRUN".into());
            }
            if counted {
                cmd.push("COUNTDENIED".into());
            }
            let r = rl(&mut con, &cmd);
            // A peek (cost 0) is always allowed, even over the limit (a
            // COUNTDENIED log can hold more than its limit).
            let fits = op.cost == 0 || (op.cost <= limit && used + op.cost <= limit);
            let context = format!(
                "{} op {i} {op:?} limit {limit} used {used}: {r:?}",
                algo.name()
            );
            prop_assert_eq!(r.allowed, fits, "{}", context);
            prop_assert_eq!(r.limit, limit as i64, "{}", context);
            if fits {
                let after = used + op.cost;
                prop_assert_eq!(
                    r.remaining,
                    limit.saturating_sub(after) as i64,
                    "{}",
                    context
                );
                prop_assert_eq!(r.retry_after, 0, "{}", context);
            } else if op.cost > limit {
                prop_assert_eq!(r.retry_after, -1, "{}", context);
            } else {
                prop_assert!(r.retry_after > 0, "{}", context);
                if !counted {
                    prop_assert_eq!(r.remaining, (limit - used) as i64, "{}", context);
                }
            }
            if (r.reset_after == 0) != (used == 0 && (op.cost == 0 || !fits)) && !counted {
                return Err(TestCaseError::fail(format!(
                    "reset_after_ms 0 iff nothing is used: {context}"
                )));
            }
            if !op.dry && (fits || (counted && op.cost <= limit)) {
                used += op.cost;
            }
        }
        // The stored state agrees with the model.
        let mut peek = match algo {
            Algo::TokenBucket => argv!["RL.TOKENBUCKET", &key, limit, 1, "3650d"],
            _ => algo.cmd(&key, limit, "1h"),
        };
        peek.extend(argv!["COST", 0]);
        let r = rl(&mut con, &peek);
        prop_assert_eq!(
            r.remaining,
            limit.saturating_sub(used) as i64,
            "final COST 0 peek"
        );
        prop_assert_eq!(
            exists(&mut con, &key),
            used > 0,
            "key exists iff something was written"
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{}: {e}", algo.name());
    }
}

#[test]
fn token_bucket_follows_the_model() {
    run_model(Algo::TokenBucket, false);
}

#[test]
fn fixed_window_follows_the_model() {
    run_model(Algo::FixedWindow, false);
}

#[test]
fn sliding_window_follows_the_model() {
    run_model(Algo::SlidingWindow, false);
}

#[test]
fn sliding_log_follows_the_model() {
    run_model(Algo::SlidingLog, false);
}

#[test]
fn sliding_log_countdenied_follows_the_model() {
    run_model(Algo::SlidingLog, true);
}
