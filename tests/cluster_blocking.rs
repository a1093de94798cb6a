//! Waiting clients (BLOCK) while their key's slot moves: they are answered,
//! never left hanging, and the lease they wait behind arrives intact on the
//! new owner. Classic MIGRATE resharding on every version, atomic slot
//! migration (CLUSTER MIGRATESLOTS) on Valkey 9 and later.

mod common;

use common::cluster::*;
use common::*;
use redis::Value;
use std::thread;

/// Holds the one slot of lease key `key` on `node` and starts a waiter for
/// it there; returns the held lease's id and the waiter.
fn hold_and_wait(node: &Node, key: &str) -> (String, thread::JoinHandle<Value>) {
    let mut con = node.conn();
    let reply = q(&mut con, &argv!["RL.LEASE", key, 1, "1h"]);
    let id = string(&array(&reply)[5]);
    let mut waiter = node.conn();
    let key = key.to_string();
    let handle =
        thread::spawn(move || raw(&mut waiter, &argv!["RL.LEASE", key, 1, "1h", "BLOCK", 0]));
    until_waiting(&mut con, 1);
    (id, handle)
}

/// The waiter's answer: an error that sends the client to the key's new
/// home (TRYAGAIN, then MOVED when it calls again; or MOVED at once).
fn assert_redirected(reply: &Value) {
    let error = error_of(reply).unwrap_or_else(|| panic!("the waiter was answered {reply:?}"));
    assert!(
        error.starts_with("TRYAGAIN") || error.starts_with("MOVED"),
        "{error}"
    );
}

#[test]
fn waiters_are_answered_when_their_slot_moves() {
    let mut cluster = Cluster::start();
    let slot = cluster.slot("{blk}");
    let source = cluster.primary_for_slot(slot);
    let target = *cluster
        .primaries()
        .iter()
        .find(|&&p| p != source)
        .expect("another primary");
    let key = "rl:{blk}:lease";
    // A lease that simply expires frees its key: in a cluster too, the
    // waiter gets the slot (found in review: it was told TRYAGAIN).
    let mut con = cluster.nodes[source].conn();
    let short = "rl:{blk}:short";
    assert_eq!(
        int(&array(&q(&mut con, &argv!["RL.LEASE", short, 1, "300ms"]))[0]),
        1
    );
    for _ in 0..2 {
        let reply = q(
            &mut con,
            &argv!["RL.LEASE", short, 1, "300ms", "BLOCK", "5s"],
        );
        assert_eq!(
            int(&array(&reply)[0]),
            1,
            "granted when the lease expired: {reply:?}"
        );
    }
    q(&mut con, &argv!["DEL", short]);

    let (id, waiter) = hold_and_wait(&cluster.nodes[source], key);

    // Classic resharding: the key leaves the source with MIGRATE.
    let mut scon = cluster.nodes[source].conn();
    let mut tcon = cluster.nodes[target].conn();
    let (source_id, target_id) = (
        cluster.nodes[source].id.clone(),
        cluster.nodes[target].id.clone(),
    );
    q(
        &mut tcon,
        &argv!["CLUSTER", "SETSLOT", slot, "IMPORTING", &source_id],
    );
    q(
        &mut scon,
        &argv!["CLUSTER", "SETSLOT", slot, "MIGRATING", &target_id],
    );
    let target_port = cluster.nodes[target].port;
    let migrate = argv!["MIGRATE", "127.0.0.1", target_port, key, 0, 5000];
    assert_eq!(q(&mut scon, &migrate), Value::Okay);
    let reply = waiter.join().expect("waiter");
    assert_redirected(&reply);
    assert_eq!(waiting(&mut scon), 0);
    // Nothing was granted on the source: the key is not there, and the
    // lease is held on the target under the same id.
    assert_eq!(
        int(&q(&mut scon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        0,
        "the waiter created the key on the source"
    );
    for p in cluster.primaries() {
        let mut con = cluster.nodes[p].conn();
        q(
            &mut con,
            &argv!["CLUSTER", "SETSLOT", slot, "NODE", &target_id],
        );
    }
    cluster.wait_converged();
    let denied = q(&mut tcon, &argv!["RL.LEASE", key, 1, "1h"]);
    assert_eq!(
        int(&array(&denied)[0]),
        0,
        "the held lease moved with its key"
    );
    assert_eq!(int(&q(&mut tcon, &argv!["RL.RELEASE", key, &id])), 1);

    if server_major_version() < 9 {
        eprintln!(
            "SKIPPED: atomic slot migration needs Valkey 9, the server is {}",
            server_version()
        );
        return;
    }
    // Atomic slot migration: back from target to source, a waiter on the
    // target meanwhile.
    let (id, waiter) = hold_and_wait(&cluster.nodes[target], key);
    let reply = try_q(
        &mut tcon,
        &argv![
            "CLUSTER",
            "MIGRATESLOTS",
            "SLOTSRANGE",
            slot,
            slot,
            "NODE",
            &source_id
        ],
    );
    assert_eq!(reply, Ok(Value::Okay), "CLUSTER MIGRATESLOTS");
    let reply = waiter.join().expect("waiter");
    assert_redirected(&reply);
    cluster.wait_converged();
    assert_eq!(cluster.primary_for_slot(slot), source);
    assert_eq!(int(&q(&mut scon, &argv!["RL.RELEASE", key, &id])), 1);
}

#[test]
fn waiters_are_answered_when_their_primary_fails_over() {
    let mut cluster = Cluster::start();
    let key = "rl:{fo}:lease";
    let slot = cluster.slot("{fo}");
    let primary = cluster.primary_for_slot(slot);
    let replica = cluster.replica_of(primary);
    let (id, waiter) = hold_and_wait(&cluster.nodes[primary], key);
    cluster.sync(primary, replica);
    // A manual failover pauses writes on the primary first (the waiter must
    // not be granted then), then demotes it: the server answers its waiters.
    let mut rcon = cluster.nodes[replica].conn();
    q(&mut rcon, &argv!["CLUSTER", "FAILOVER"]);
    let reply = waiter.join().expect("waiter");
    let error = error_of(&reply).unwrap_or_else(|| panic!("the waiter was answered {reply:?}"));
    assert!(
        ["UNBLOCKED", "MOVED", "REDIRECT"]
            .iter()
            .any(|prefix| error.starts_with(prefix)),
        "{error}"
    );
    cluster.wait_swapped(replica, primary);
    cluster.wait_converged();
    // The lease the waiter queued behind is held on the new primary, under
    // the same id; the waiter took nothing.
    let peek = Reply::parse(&q(&mut rcon, &argv!["RL.PEEK", key]));
    assert_eq!(peek.remaining, 0);
    assert_eq!(int(&q(&mut rcon, &argv!["RL.RELEASE", key, &id])), 1);
}
