//! Slot migration carries live limiters intact: classic MIGRATE-based
//! resharding (every version) and atomic slot migration (CLUSTER
//! MIGRATESLOTS, Valkey 9 and later). After the move the new owner has every
//! key with the same DEBUG DIGEST-VALUE and PEXPIRETIME, and decides exactly
//! what the old owner would have decided.

mod common;

use common::cluster::*;
use common::*;
use redis::Value;
use std::collections::BTreeMap;
use std::time::Instant;

/// Limiters in the migrated slot.
const KEYS: usize = 12;

/// The slot of hash tag `tag`, its primary, and another primary to move it to.
fn pick(cluster: &mut Cluster, tag: &str) -> (u16, usize, usize) {
    let slot = cluster.slot(&format!("{{{tag}}}"));
    let source = cluster.primary_for_slot(slot);
    let target = *cluster
        .primaries()
        .iter()
        .find(|&&p| p != source)
        .expect("another primary");
    (slot, source, target)
}

/// After the move: the slot's keys are gone from the source and its replica,
/// and on the target and its replica they are exactly as before.
fn assert_moved(
    cluster: &mut Cluster,
    slot: u16,
    source: usize,
    target: usize,
    snaps: &[KeySnap],
    other_keys: usize,
    expire_slack_ms: i64,
) {
    cluster.wait_converged();
    assert_eq!(
        cluster.primary_for_slot(slot),
        target,
        "owner of slot {slot}"
    );
    cluster.wait_replicas_synced();
    let mut scon = cluster.nodes[source].conn();
    assert_eq!(
        int(&q(&mut scon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        0,
        "the source still has keys of slot {slot}"
    );
    let target_addr = cluster.nodes[target].addr();
    let e = q_err(&mut scon, &argv!["RL.PEEK", &snaps[0].key]);
    assert_eq!(
        e,
        format!("MOVED {slot} {target_addr}"),
        "source after the move"
    );
    let source_replica = cluster.replica_of(source);
    let mut srcon = cluster.nodes[source_replica].conn();
    assert_eq!(
        int(&q(&mut srcon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        0,
        "the source's replica still has keys of slot {slot}"
    );
    let mut tcon = cluster.nodes[target].conn();
    assert_eq!(
        int(&q(&mut tcon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        (snaps.len() + other_keys) as i64,
        "keys of slot {slot} on the target"
    );
    assert_same_state(&mut tcon, snaps, expire_slack_ms, "the new owner");
    let target_replica = cluster.replica_of(target);
    let mut trcon = cluster.nodes[target_replica].conn();
    q(&mut trcon, &argv!["READONLY"]);
    assert_same_state(
        &mut trcon,
        snaps,
        expire_slack_ms,
        "the new owner's replica",
    );
    assert_same_decisions(&mut tcon, snaps, "the new owner");
}

#[test]
fn classic_slot_migration_keeps_limiters_exactly() {
    let mut cluster = Cluster::start();
    let (slot, source, target) = pick(&mut cluster, "mig");
    let mut scon = cluster.nodes[source].conn();
    avoid_boundary(&mut scon, ONE_HOUR_MS, 300_000);
    let keys = populate(&mut cluster.client(), "mig", KEYS);
    let snaps = snapshot(&mut scon, &keys);
    let mut tcon = cluster.nodes[target].conn();
    let (source_id, target_id) = (
        cluster.nodes[source].id.clone(),
        cluster.nodes[target].id.clone(),
    );
    let target_port = cluster.nodes[target].port;
    let source_addr = cluster.nodes[source].addr();

    q(
        &mut tcon,
        &argv!["CLUSTER", "SETSLOT", slot, "IMPORTING", &source_id],
    );
    q(
        &mut scon,
        &argv!["CLUSTER", "SETSLOT", slot, "MIGRATING", &target_id],
    );
    let mut migrate_ms = 0;
    let mut migrate = |scon: &mut redis::Connection, batch: &[String]| {
        let mut cmd = argv!["MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS"];
        cmd.extend(batch.iter().cloned());
        let t = Instant::now();
        assert_eq!(q(scon, &cmd), Value::Okay, "{cmd:?}");
        migrate_ms += t.elapsed().as_millis() as i64 + 1;
    };

    // Half the keys first: while the slot is half moved, the source sends
    // clients of a moved key to the target (ASK), and the target serves it
    // only after ASKING.
    let half = &keys[..KEYS / 2];
    migrate(&mut scon, half);
    let target_addr = cluster.nodes[target].addr();
    let moved = &snaps[0];
    let dry = moved.algo.cmd_with(&moved.key, LIMIT, PERIOD, &["DRYRUN"]);
    assert_eq!(
        q_err(&mut scon, &dry),
        format!("ASK {slot} {target_addr}"),
        "a migrated key on the source"
    );
    assert_eq!(
        q_err(&mut tcon, &dry),
        format!("MOVED {slot} {source_addr}"),
        "a migrated key on the target without ASKING"
    );
    q(&mut tcon, &argv!["ASKING"]);
    let r = rl(&mut tcon, &dry);
    assert_eq!(
        (r.allowed, r.limit, r.remaining),
        (moved.next.allowed, moved.next.limit, moved.next.remaining),
        "DRYRUN on the target (ASKING) vs on the source before"
    );
    // A key not moved yet is still served by the source.
    let stay = &snaps[KEYS - 1];
    let r = rl(
        &mut scon,
        &stay.algo.cmd_with(&stay.key, LIMIT, PERIOD, &["DRYRUN"]),
    );
    assert_eq!(
        (r.allowed, r.remaining),
        (stay.next.allowed, stay.next.remaining)
    );

    // The rest, as a resharding tool does it.
    loop {
        let batch: Vec<String> = array(&q(&mut scon, &argv!["CLUSTER", "GETKEYSINSLOT", slot, 5]))
            .iter()
            .map(string)
            .collect();
        if batch.is_empty() {
            break;
        }
        migrate(&mut scon, &batch);
    }
    q(
        &mut tcon,
        &argv!["CLUSTER", "SETSLOT", slot, "NODE", &target_id],
    );
    q(
        &mut scon,
        &argv!["CLUSTER", "SETSLOT", slot, "NODE", &target_id],
    );
    for p in cluster.primaries() {
        if p != source && p != target {
            let mut con = cluster.nodes[p].conn();
            q(
                &mut con,
                &argv!["CLUSTER", "SETSLOT", slot, "NODE", &target_id],
            );
        }
    }
    // MIGRATE sends a relative TTL (the server's RESTORE adds the target's
    // clock), so PEXPIRETIME may move later by up to the time MIGRATE took.
    eprintln!("MIGRATE took {migrate_ms} ms in total");
    assert_moved(&mut cluster, slot, source, target, &snaps, 0, migrate_ms);
}

/// One CLUSTER GETSLOTMIGRATIONS entry as name -> value.
fn migrations(con: &mut redis::Connection) -> Vec<BTreeMap<String, String>> {
    array(&q(con, &argv!["CLUSTER", "GETSLOTMIGRATIONS"]))
        .iter()
        .map(|entry| match entry {
            Value::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| (string(k), value_text(v)))
                .collect(),
            Value::Array(flat) => flat
                .chunks(2)
                .map(|kv| (string(&kv[0]), value_text(&kv[1])))
                .collect(),
            v => panic!("GETSLOTMIGRATIONS entry: {v:?}"),
        })
        .collect()
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Nil => String::new(),
        v => string(v),
    }
}

#[test]
fn atomic_slot_migration_keeps_limiters_exactly() {
    let major = server_major_version();
    if major < 9 {
        eprintln!(
            "SKIPPED: atomic slot migration (CLUSTER MIGRATESLOTS) needs Valkey 9, the server is {}",
            server_version()
        );
        return;
    }
    let mut cluster = Cluster::start();
    let (slot, source, target) = pick(&mut cluster, "asm");
    let mut scon = cluster.nodes[source].conn();
    avoid_boundary(&mut scon, ONE_HOUR_MS, 300_000);
    let keys = populate(&mut cluster.client(), "asm", KEYS);
    let snaps = snapshot(&mut scon, &keys);
    let target_id = cluster.nodes[target].id.clone();

    // A limiter that keeps being used while the slot moves: every decision
    // the source makes until it answers MOVED must arrive on the target.
    const CAPACITY: i64 = 1_000_000;
    let live = "rl:{asm}:live";
    let live_cmd = argv!["RL.TOKENBUCKET", live, CAPACITY, 1, "1h"];
    let mut allowed = i64::from(rl(&mut scon, &live_cmd).allowed);

    let started = Instant::now();
    let reply = try_q(
        &mut scon,
        &argv![
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            slot,
            slot,
            "NODE",
            &target_id
        ],
    );
    assert_eq!(reply, Ok(Value::Okay), "CLUSTER MIGRATESLOTS");
    let target_addr = cluster.nodes[target].addr();
    let end_error = loop {
        match try_q(&mut scon, &live_cmd) {
            Ok(v) => {
                let r = Reply::parse(&v);
                assert!(r.allowed, "{r:?}");
                allowed += 1;
            }
            Err(e) => break e,
        }
        assert!(
            started.elapsed() < CONVERGE_TIMEOUT,
            "the source still serves slot {slot} after {CONVERGE_TIMEOUT:?}: {:?}",
            migrations(&mut scon)
        );
    };
    assert_eq!(
        end_error,
        format!("MOVED {slot} {target_addr}"),
        "the live limiter after the move"
    );
    // Both sides report the job done.
    for (node, operation) in [(source, "EXPORT"), (target, "IMPORT")] {
        let mut con = cluster.nodes[node].conn();
        wait_until(
            &format!("{operation} job succeeded"),
            CONVERGE_TIMEOUT,
            || {
                let jobs = migrations(&mut con);
                let job = jobs
                    .iter()
                    .find(|j| j.get("operation").map(String::as_str) == Some(operation))
                    .ok_or_else(|| format!("no {operation} job: {jobs:?}"))?;
                match job.get("state").map(String::as_str) {
                    Some("success") => Ok(()),
                    Some("failed") | Some("cancelled") => panic!("{operation} job: {job:?}"),
                    _ => Err(format!("{job:?}")),
                }
            },
        );
    }
    eprintln!(
        "MIGRATESLOTS done in {:?}, {allowed} live decisions on the source",
        started.elapsed()
    );

    // Atomic migration ships RL.APPLY + PEXPIREAT: expiries identical.
    assert_moved(&mut cluster, slot, source, target, &snaps, 1, 0);
    let mut tcon = cluster.nodes[target].conn();
    let r = rl(
        &mut tcon,
        &argv!["RL.TOKENBUCKET", live, CAPACITY, 1, "1h", "COST", 0],
    );
    assert_eq!(
        r.remaining,
        CAPACITY - allowed,
        "the live limiter on the target: {allowed} calls were allowed on the source"
    );
}
