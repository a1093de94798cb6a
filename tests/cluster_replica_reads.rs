//! RL.PEEK on replicas: with READONLY a cluster replica answers RL.PEEK for
//! its primary's slots with the primary's `limit` and `remaining`; without
//! READONLY it redirects; writes are never served by a replica.

mod common;

use common::cluster::*;
use common::*;
use redis::Value;
use std::time::Instant;

/// RL.PEEK on `primary` then on `replica`: same limit and remaining, and the
/// replica's reset_after_ms no later than the primary's by more than the
/// time between the two calls.
fn assert_peeks_agree(
    pcon: &mut redis::Connection,
    rcon: &mut redis::Connection,
    key: &str,
    limit: i64,
    remaining: i64,
) {
    let t = Instant::now();
    let p = rl(pcon, &argv!["RL.PEEK", key]);
    let r = rl(rcon, &argv!["RL.PEEK", key]);
    let elapsed = t.elapsed().as_millis() as i64 + 1;
    assert_eq!(
        (p.allowed, p.limit, p.remaining, p.retry_after),
        (true, limit, remaining, 0),
        "{key}: RL.PEEK on the primary: {p:?}"
    );
    assert_eq!(
        (r.allowed, r.limit, r.remaining, r.retry_after),
        (p.allowed, p.limit, p.remaining, p.retry_after),
        "{key}: RL.PEEK on the replica vs the primary: {r:?} vs {p:?}"
    );
    let drift = p.reset_after - r.reset_after;
    assert!(
        (-1..=elapsed).contains(&drift),
        "{key}: reset_after_ms {} on the replica, {} on the primary ({elapsed} ms apart)",
        r.reset_after,
        p.reset_after
    );
}

/// Calls each algorithm's key `calls` times on `con`; returns (key, limit, remaining).
fn drive(con: &mut redis::Connection, keys: &[String]) -> Vec<(String, i64, i64)> {
    keys.iter()
        .enumerate()
        .map(|(i, key)| {
            let algo = algo_of(i);
            let calls = i % 5 + 1;
            for _ in 0..calls {
                rl(con, &algo.cmd(key, 10, "1h"));
            }
            (key.clone(), 10, 10 - calls as i64)
        })
        .collect()
}

#[test]
fn cluster_replica_serves_rl_peek_after_readonly() {
    let mut cluster = Cluster::start();
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary);
    let mut pcon = cluster.nodes[primary].conn();
    avoid_boundary(&mut pcon, ONE_HOUR_MS, 300_000);
    let keys = cluster.keys_by_primary("rl:peek:", 8)[&primary].clone();
    let expected = drive(&mut pcon, &keys);
    cluster.sync(primary, replica);

    let slot = cluster.slot(&keys[0]);
    let primary_addr = cluster.nodes[primary].addr();
    let mut rcon = cluster.nodes[replica].conn();
    // Without READONLY a replica redirects reads of its primary's slots.
    assert_eq!(
        q_err(&mut rcon, &argv!["RL.PEEK", &keys[0]]),
        format!("MOVED {slot} {primary_addr}"),
        "RL.PEEK on a replica without READONLY"
    );
    q(&mut rcon, &argv!["READONLY"]);
    for (key, limit, remaining) in &expected {
        assert_peeks_agree(&mut pcon, &mut rcon, key, *limit, *remaining);
    }
    let absent = cluster.keys_by_primary("rl:absent:", 1)[&primary][0].clone();
    assert_eq!(q(&mut rcon, &argv!["RL.PEEK", &absent]), Value::Nil);
    // Writes still go to the primary, READONLY or not.
    for (i, (key, _, _)) in expected.iter().enumerate() {
        let e = q_err(&mut rcon, &algo_of(i).cmd(key, 10, "1h"));
        let key_slot = cluster.slot(key);
        assert!(
            e == format!("MOVED {key_slot} {primary_addr}") || e.starts_with("READONLY"),
            "{} on a READONLY replica: {e}",
            algo_of(i).name()
        );
    }
    // Nothing the replica was asked changed anything.
    for (key, limit, remaining) in &expected {
        assert_peeks_agree(&mut pcon, &mut rcon, key, *limit, *remaining);
        assert_eq!(digest(&mut pcon, key), digest(&mut rcon, key), "{key}");
    }
    // A replica serves only its own primary's slots.
    let other = cluster
        .primaries()
        .into_iter()
        .find(|&p| p != primary)
        .unwrap();
    let foreign = cluster.keys_by_primary("rl:foreign:", 1)[&other][0].clone();
    let e = q_err(&mut rcon, &argv!["RL.PEEK", &foreign]);
    assert!(
        e.starts_with("MOVED "),
        "RL.PEEK of another shard's key: {e}"
    );
}

#[test]
fn plain_replica_serves_rl_peek() {
    let (primary, replica) = primary_and_replica(&[]);
    let mut pcon = primary.conn();
    avoid_boundary(&mut pcon, ONE_HOUR_MS, 300_000);
    let keys: Vec<String> = (0..8).map(|i| format!("rl:plain:{i}")).collect();
    let expected = drive(&mut pcon, &keys);
    sync_replica(&primary, &replica);
    let mut rcon = replica.conn();
    for (key, limit, remaining) in &expected {
        assert_peeks_agree(&mut pcon, &mut rcon, key, *limit, *remaining);
    }
    assert_eq!(
        q(&mut rcon, &argv!["RL.PEEK", "rl:plain:absent"]),
        Value::Nil
    );
    let e = q_err(&mut rcon, &Algo::TokenBucket.cmd(&keys[0], 10, "1h"));
    assert!(
        e.starts_with("READONLY"),
        "RL.TOKENBUCKET on a replica: {e}"
    );
}
