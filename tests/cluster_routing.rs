//! Valkey Cluster routing: a cluster client reaches every key's owner, limits
//! hold exactly per key across all slots, hash tags keep limiters together,
//! and a node answers MOVED (or CROSSSLOT) for what it does not serve.

mod common;

use common::cluster::*;
use common::*;
use redis::Value;
use std::collections::{BTreeMap, BTreeSet};

const KEYS: usize = 2000;
const ROUTE_LIMIT: u64 = 3;

#[test]
fn cluster_client_routes_every_key_and_limits_hold_per_key() {
    let mut cluster = Cluster::start();
    avoid_boundary(&mut cluster.nodes[0].conn(), ONE_HOUR_MS, 300_000);
    let mut client = cluster.client();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("rl:route:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let algo = algo_of(i);
        for call in 0..=ROUTE_LIMIT {
            let r = crl(&mut client, &algo.cmd(key, ROUTE_LIMIT, "1h"));
            let expected = (
                call < ROUTE_LIMIT,
                ROUTE_LIMIT as i64,
                (ROUTE_LIMIT as i64 - 1 - call as i64).max(0),
            );
            assert_eq!(
                (r.allowed, r.limit, r.remaining),
                expected,
                "{key} ({}) call {call}: {r:?}",
                algo.name()
            );
        }
    }

    // Every key lives exactly on the primary that serves its slot.
    let map = cluster.slot_map();
    let primaries = cluster.primaries();
    let mut cons: BTreeMap<usize, redis::Connection> = primaries
        .iter()
        .map(|&p| (p, cluster.nodes[p].conn()))
        .collect();
    let mut per_primary: BTreeMap<usize, i64> = BTreeMap::new();
    let mut slots = BTreeSet::new();
    for key in &keys {
        let slot = {
            let con = cons.values_mut().next().unwrap();
            int(&q(con, &argv!["CLUSTER", "KEYSLOT", key])) as u16
        };
        assert_eq!(
            slot,
            redis::cluster_routing::get_slot(key.as_bytes()),
            "CLUSTER KEYSLOT {key} vs the client's CRC16"
        );
        slots.insert(slot);
        let owner = map[usize::from(slot)];
        *per_primary.entry(owner).or_default() += 1;
        let owner_port = cluster.nodes[owner].port;
        for (&p, con) in cons.iter_mut() {
            if p == owner {
                assert!(exists(con, key), "{key} (slot {slot}) missing on its owner");
                assert!(
                    int(&q(con, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])) >= 1,
                    "COUNTKEYSINSLOT {slot} on the owner of {key}"
                );
            } else {
                let e = q_err(con, &argv!["EXISTS", key]);
                assert_eq!(
                    e,
                    format!("MOVED {slot} 127.0.0.1:{owner_port}"),
                    "EXISTS {key}"
                );
                assert_eq!(
                    int(&q(con, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
                    0,
                    "slot {slot} has keys on node {p}, which does not serve it"
                );
            }
        }
    }
    assert!(slots.len() > 1000, "keys cover only {} slots", slots.len());
    for (&p, con) in cons.iter_mut() {
        let expected = per_primary.get(&p).copied().unwrap_or(0);
        assert!(expected > 0, "primary {p} got no keys");
        assert_eq!(
            int(&q(con, &argv!["DBSIZE"])),
            expected,
            "DBSIZE of primary {p}: a key was written twice or on the wrong node"
        );
    }
    // Replicas hold exactly their primary's keys.
    cluster.wait_replicas_synced();
    for &p in &primaries {
        let r = cluster.replica_of(p);
        let mut rcon = cluster.nodes[r].conn();
        assert_eq!(
            int(&q(&mut rcon, &argv!["DBSIZE"])),
            per_primary[&p],
            "DBSIZE of replica {r} of {p}"
        );
    }
}

#[test]
fn wrong_node_answers_moved_and_hash_tags_keep_limiters_together() {
    let mut cluster = Cluster::start();
    let mut client = cluster.client();

    // COMMAND GETKEYS names argument 1, and the key's slot is where it lives.
    let mut con0 = cluster.nodes[0].conn();
    for cmd in [
        argv!["RL.TOKENBUCKET", "k", 1, 1, 1],
        argv!["RL.WINDOW", "k", 1, 1],
        argv!["RL.WINDOW", "k", 1, 1, "SLIDING"],
        argv!["RL.SLIDINGLOG", "k", 1, 1, "COST", 0],
        argv!["RL.PEEK", "k"],
    ] {
        let mut getkeys = argv!["COMMAND", "GETKEYS"];
        getkeys.extend(cmd.iter().cloned());
        let keys: Vec<String> = array(&q(&mut con0, &getkeys)).iter().map(string).collect();
        assert_eq!(keys, vec!["k".to_string()], "COMMAND GETKEYS {cmd:?}");
    }
    crl(&mut client, &argv!["RL.TOKENBUCKET", "k", 1, 1, 1]);
    let slot = cluster.slot("k");
    let owner = cluster.primary_for_slot(slot);
    let mut ocon = cluster.nodes[owner].conn();
    assert_eq!(
        int(&q(&mut ocon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        1
    );
    let in_slot: Vec<String> = array(&q(&mut ocon, &argv!["CLUSTER", "GETKEYSINSLOT", slot, 10]))
        .iter()
        .map(string)
        .collect();
    assert_eq!(in_slot, vec!["k".to_string()]);

    // Every RL command on a node that does not serve the key: MOVED to the owner.
    let owner_addr = cluster.nodes[owner].addr();
    for p in cluster.primaries() {
        if p == owner {
            continue;
        }
        let mut con = cluster.nodes[p].conn();
        for algo in Algo::ALL {
            let e = q_err(&mut con, &algo.cmd("k", 5, "1h"));
            assert_eq!(
                e,
                format!("MOVED {slot} {owner_addr}"),
                "{} on node {p}",
                algo.name()
            );
        }
        let e = q_err(&mut con, &argv!["RL.PEEK", "k"]);
        assert_eq!(
            e,
            format!("MOVED {slot} {owner_addr}"),
            "RL.PEEK on node {p}"
        );
        // A script declaring the key is refused the same way.
        let e = q_err(
            &mut con,
            &argv![
                "EVAL",
                "return server.call('RL.TOKENBUCKET', KEYS[1], 5, 1, '1h')",
                1,
                "k"
            ],
        );
        assert_eq!(e, format!("MOVED {slot} {owner_addr}"), "EVAL on node {p}");
        assert_eq!(
            int(&q(&mut con, &argv!["DBSIZE"])),
            0,
            "node {p} wrote a key"
        );
    }

    // Hash tags: one slot, one node, usable together in MULTI/EXEC.
    let login = "rl:{user:42}:login";
    let api = "rl:{user:42}:api";
    let slot = cluster.slot(login);
    assert_eq!(
        cluster.slot(api),
        slot,
        "CLUSTER KEYSLOT of {login} and {api}"
    );
    let r = crl(&mut client, &argv!["RL.SLIDINGLOG", login, 5, "15m"]);
    assert!(r.allowed && r.remaining == 4, "{r:?}");
    let r = crl(&mut client, &argv!["RL.TOKENBUCKET", api, 100, 10, "1s"]);
    assert!(r.allowed && r.remaining == 99, "{r:?}");
    let owner = cluster.primary_for_slot(slot);
    let mut ocon = cluster.nodes[owner].conn();
    let items = exec(
        &mut ocon,
        &[
            argv!["RL.SLIDINGLOG", login, 5, "15m"],
            argv!["RL.TOKENBUCKET", api, 100, 10, "1s", "COST", 10],
        ],
    );
    let (a, b) = (Reply::parse(&items[0]), Reply::parse(&items[1]));
    assert!(a.allowed && a.remaining == 3, "{a:?}");
    assert!(b.allowed && b.remaining <= 89, "{b:?}");
    assert_eq!(
        int(&q(&mut ocon, &argv!["CLUSTER", "COUNTKEYSINSLOT", slot])),
        2
    );

    // Two keys of the same node but different slots in one transaction:
    // CROSSSLOT, and nothing is written.
    let mine: Vec<String> = cluster.keys_by_primary("rl:cross:", 2)[&owner].clone();
    assert_ne!(cluster.slot(&mine[0]), cluster.slot(&mine[1]));
    let before = int(&q(&mut ocon, &argv!["DBSIZE"]));
    let mut replies = vec![raw(&mut ocon, &argv!["MULTI"])];
    replies.push(raw(&mut ocon, &Algo::TokenBucket.cmd(&mine[0], 5, "1h")));
    replies.push(raw(&mut ocon, &Algo::SlidingLog.cmd(&mine[1], 5, "1h")));
    let exec_reply = raw(&mut ocon, &argv!["EXEC"]);
    let errors: Vec<String> = replies
        .iter()
        .chain(std::iter::once(&exec_reply))
        .filter_map(error_of)
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("CROSSSLOT")),
        "MULTI over two slots: {replies:?} then EXEC {exec_reply:?}"
    );
    assert!(
        !matches!(exec_reply, Value::Array(_)),
        "EXEC ran: {exec_reply:?}"
    );
    assert_eq!(
        int(&q(&mut ocon, &argv!["DBSIZE"])),
        before,
        "CROSSSLOT wrote"
    );

    // RL.ALL declares every key: over two slots the server answers
    // CROSSSLOT and writes nothing; with a hash tag a cluster client routes
    // it to the owner and it consumes from both limiters.
    let e = q_err(
        &mut ocon,
        &argv!["RL.ALL", 2, &mine[0], &mine[1], "WINDOW", 5, "1h", "GCRA", 5, 1, "1h"],
    );
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    assert_eq!(
        int(&q(&mut ocon, &argv!["DBSIZE"])),
        before,
        "RL.ALL CROSSSLOT wrote"
    );
    let day = "rl:{user:42}:day";
    let v = cq(
        &mut client,
        &argv![
            "RL.ALL",
            2,
            api,
            day,
            "TOKENBUCKET",
            100,
            10,
            "1s",
            "WINDOW",
            1000,
            "1d"
        ],
    );
    assert_eq!(int(&array(&v)[0]), 1, "{v:?}");
    // The cluster client routes an unknown command by its first argument
    // (here "2"), to whichever node; that node must answer MOVED, not write
    // the keys of a slot it does not own. (The bucket refills within 100 ms
    // and expires; the day window stays.)
    assert!(
        exists(&mut ocon, day),
        "RL.ALL wrote on the owner of the tag's slot"
    );
}
