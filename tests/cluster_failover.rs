//! Failover: a primary SIGKILLed under load hands its slots to its replica,
//! which never gives back budget whose consumption the replica had
//! acknowledged (WAIT) and never invents consumption; a manual CLUSTER
//! FAILOVER loses nothing at all.

mod common;

use common::cluster::*;
use common::*;
use redis::{ConnectionLike, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const THREADS: usize = 4;
const KEYS_PER_THREAD: usize = 10;
/// Never exhausted in a test; refill 1 per hour: nothing refills either.
const CAPACITY: i64 = 1_000_000;

/// What one client knows about one key.
#[derive(Clone, Copy, Debug, Default)]
struct Ledger {
    /// Calls that got `allowed = 1`.
    allowed: i64,
    /// `allowed` as of the last `WAIT 1 1000` that returned 1: consumption a
    /// replica acknowledged.
    acked: i64,
    /// 1 when the last call got no reply (the primary died): it may or may
    /// not have been applied.
    unanswered: i64,
}

fn bucket(key: &str, options: &[&str]) -> Vec<String> {
    let mut cmd = argv!["RL.TOKENBUCKET", key, CAPACITY, 1, "1h"];
    cmd.extend(options.iter().map(|s| s.to_string()));
    cmd
}

/// Runs RL.TOKENBUCKET on `keys` round-robin on one connection, with
/// `WAIT 1 1000` after each allowed call, until the connection fails.
fn load(
    url: String,
    keys: Vec<String>,
    acked_total: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> BTreeMap<String, Ledger> {
    let mut ledger: BTreeMap<String, Ledger> = keys
        .iter()
        .map(|k| (k.clone(), Ledger::default()))
        .collect();
    let client = redis::Client::open(url).expect("client");
    let mut con = client.get_connection().expect("connect");
    con.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    'outer: while !stop.load(Ordering::SeqCst) {
        for key in &keys {
            let reply = match con.req_command(&to_cmd(&bucket(key, &[]))) {
                Ok(v) => v,
                Err(_) => {
                    ledger.get_mut(key).unwrap().unanswered = 1;
                    break 'outer;
                }
            };
            if let Some(e) = error_of(&reply) {
                panic!("{key}: {e}");
            }
            let r = Reply::parse(&reply);
            assert!(r.allowed, "{key}: {r:?}");
            ledger.get_mut(key).unwrap().allowed += 1;
            match con.req_command(redis::cmd("WAIT").arg(1).arg(1000)) {
                Ok(Value::Int(1)) => {
                    // WAIT acknowledges every earlier write of this connection.
                    let mut newly = 0;
                    for l in ledger.values_mut() {
                        newly += l.allowed - l.acked;
                        l.acked = l.allowed;
                    }
                    acked_total.fetch_add(newly as u64, Ordering::SeqCst);
                }
                Ok(_) => {}
                Err(_) => break 'outer,
            }
        }
    }
    ledger
}

#[test]
fn acknowledged_consumption_survives_a_primary_crash() {
    let mut cluster = Cluster::start();
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary);
    let keys = cluster.keys_by_primary("rl:fo:", THREADS * KEYS_PER_THREAD)[&primary].clone();
    let acked_total = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = keys
        .chunks(KEYS_PER_THREAD)
        .map(|chunk| {
            let (url, chunk) = (cluster.nodes[primary].url(), chunk.to_vec());
            let (acked_total, stop) = (acked_total.clone(), stop.clone());
            thread::spawn(move || load(url, chunk, acked_total, stop))
        })
        .collect();
    // Let the load run: at least a second and some acknowledged decisions.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) || acked_total.load(Ordering::SeqCst) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no acknowledged decisions after 60 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
    cluster.kill(primary);
    let killed_at = Instant::now();
    stop.store(true, Ordering::SeqCst);
    let mut ledger = BTreeMap::new();
    for w in workers {
        ledger.extend(w.join().expect("load thread panicked"));
    }

    // The replica takes over by itself.
    wait_until(
        "the replica is promoted",
        CONVERGE_TIMEOUT,
        || match cluster.nodes[replica].role().as_str() {
            "master" => Ok(()),
            role => Err(role.to_string()),
        },
    );
    cluster.wait_converged();
    eprintln!("failover took {:?} after SIGKILL", killed_at.elapsed());
    assert!(cluster.primaries().contains(&replica));

    let mut con = cluster.nodes[replica].conn();
    let (mut acked, mut allowed, mut consumed) = (0, 0, 0);
    for (key, l) in &ledger {
        let r = rl(&mut con, &bucket(key, &["COST", "0"]));
        let used = CAPACITY - r.remaining;
        assert!(
            used >= l.acked,
            "{key}: the new primary has {used} consumed, but {} were acknowledged by WAIT: \
             a fresh budget after failover ({l:?})",
            l.acked
        );
        assert!(
            used <= l.allowed + l.unanswered,
            "{key}: the new primary has {used} consumed, but the old one allowed only {} \
             (+{} unanswered): consumption duplicated or invented ({l:?})",
            l.allowed,
            l.unanswered
        );
        acked += l.acked;
        allowed += l.allowed;
        consumed += used;
    }
    eprintln!(
        "{} keys: {allowed} allowed on the old primary, {acked} acknowledged, {consumed} on the new one",
        ledger.len()
    );
    assert!(acked > 0);

    // The new primary serves the slots, through a cluster client too.
    let mut client = cluster.client();
    for (key, l) in ledger.iter().take(5) {
        let before = CAPACITY - crl(&mut client, &bucket(key, &["COST", "0"])).remaining;
        assert!(before >= l.acked);
        let r = crl(&mut client, &bucket(key, &[]));
        assert!(r.allowed, "{key}: {r:?}");
        assert_eq!(r.remaining, CAPACITY - before - 1, "{key}");
    }
}

#[test]
fn manual_failover_keeps_every_limiter_exactly() {
    let mut cluster = Cluster::start();
    let primary = cluster.primaries()[1];
    let replica = cluster.replica_of(primary);
    let mut pcon = cluster.nodes[primary].conn();
    avoid_boundary(&mut pcon, ONE_HOUR_MS, 300_000);
    // Limiters of every algorithm in several slots of this primary.
    let mut keys = Vec::new();
    let mut client = cluster.client();
    let map = cluster.slot_map();
    let mut tags = 0;
    for n in 0.. {
        let tag = format!("mf{n}");
        if map[usize::from(redis::cluster_routing::get_slot(tag.as_bytes()))] != primary {
            continue;
        }
        keys.extend(populate(&mut client, &tag, 8));
        tags += 1;
        if tags == 5 {
            break;
        }
    }
    // populate numbers keys per tag; algo_of() follows the index in the tag.
    let snaps: Vec<KeySnap> = keys
        .chunks(8)
        .flat_map(|chunk| snapshot(&mut pcon, chunk))
        .collect();
    cluster.sync(primary, replica);

    let mut rcon = cluster.nodes[replica].conn();
    q(&mut rcon, &argv!["CLUSTER", "FAILOVER"]);
    cluster.wait_swapped(replica, primary);
    cluster.wait_converged();
    assert_eq!(cluster.replica_of(replica), primary);
    cluster.sync(replica, primary);

    let mut new_primary = cluster.nodes[replica].conn();
    assert_same_state(&mut new_primary, &snaps, 0, "the promoted replica");
    let mut old_primary = cluster.nodes[primary].conn();
    q(&mut old_primary, &argv!["READONLY"]);
    assert_same_state(&mut old_primary, &snaps, 0, "the demoted primary");
    assert_same_decisions(&mut new_primary, &snaps, "the promoted replica");
    // And the demoted primary follows those decisions.
    cluster.sync(replica, primary);
    for s in &snaps {
        assert_eq!(
            digest(&mut old_primary, &s.key),
            digest(&mut new_primary, &s.key),
            "{}: demoted primary vs promoted replica after new decisions",
            s.key
        );
    }
}
