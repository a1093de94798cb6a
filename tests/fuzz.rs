//! Seeded fuzzing against a real server: random and mutated argument vectors
//! for every command, RESTORE of mutated DUMP payloads, RL.APPLY of mutated
//! effects. What must hold, whatever the input: the server stays up, every
//! error starts with ERR or WRONGTYPE, an error changes no key and moves no
//! replication offset, keys of other types are never overwritten, anything
//! that loads is usable by every command, and a replica ends equal.
//!
//! `make test` runs a short run; `make fuzz` a long one. Reproduce a run with
//! `RL_FUZZ_SEED=<seed> RL_FUZZ_CASES=<n> cargo test --release --test fuzz`;
//! every failure message names the seed and the case. `RL_FUZZ_TRACE=<word>`
//! prints every call with that argument (what happened to one key).

mod common;

use std::fs;
use std::path::Path;

use common::*;
use redis::{Connection, ConnectionLike, Value};

type Argv = Vec<Vec<u8>>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Cases per test: RL_FUZZ_CASES, else `short` (the `make test` run).
fn cases(short: u64) -> u64 {
    env_u64("RL_FUZZ_CASES", short)
}

fn seed(salt: u64) -> u64 {
    env_u64("RL_FUZZ_SEED", 0x5eed_2026_1203) ^ salt
}

struct Gen(Box<dyn FnMut() -> u64>);

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen(Box::new(xorshift(seed | 1)))
    }
    fn below(&mut self, n: usize) -> usize {
        ((self.0)() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| (self.0)() as u8).collect()
    }
}

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "5",
    "16",
    "17",
    "1000000000000000",
    "1000000000000001",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "007",
    "+5",
    " 5",
    "5 ",
    "1.5",
    "1e3",
    "0x10",
];
const DURATIONS: &[&str] = &[
    "1ms",
    "0ms",
    "500ms",
    "1s",
    "10s",
    "1m",
    "1h",
    "1d",
    "3650d",
    "3651d",
    "1w",
    "10us",
    "-1s",
    "1S",
    "1H",
    "ms",
    "1 s",
    "1.5s",
    "315360000000",
    "315360000001",
];
const WORDS: &[&str] = &[
    "COST",
    "cost",
    "DRYRUN",
    "PARTIAL",
    "LOCKOUT",
    "SLIDING",
    "COUNTDENIED",
    "TOKENBUCKET",
    "WINDOW",
    "SLIDINGLOG",
    "GCRA",
    "FOO",
    "NX",
    "TZ",
    "ANCHOR",
    "month",
    "Europe/Berlin",
];
const COMMANDS: &[&str] = &[
    "RL.TOKENBUCKET",
    "RL.WINDOW",
    "RL.SLIDINGLOG",
    "RL.GCRA",
    "RL.THROTTLE",
    "CL.THROTTLE",
    "RL.ALL",
    "RL.REFUND",
    "RL.UNLOCK",
    "RL.PEEK",
    "RL.INSPECT",
    "RL.APPLY",
    "RL.LEASE",
    "RL.RELEASE",
    "RL.EXTEND",
    "RL.LIMIT",
    "RL.POLICY.SET",
    "RL.POLICY.DEL",
    "RL.POLICY.GET",
    "RL.POLICY.LIST",
    "RL.POLICY.STATS",
    "RL.POLICY.RESETSTATS",
    "RL.TOPDENIED",
];
/// Stored policy names (`nope` is rarely defined: RL.LIMIT then fails).
const POLICY_NAMES: &[&str] = &["p1", "p2", "p3", "nope"];
/// Keys the fuzz plays on; `str` and `hash` hold other types throughout.
const KEYS: &[&str] = &[
    "{f}tb", "{f}w", "{f}sl", "{f}g", "{f}x", "{f}y", "{f}l", "str", "hash",
];
const STRING_VALUE: &str = "not a limiter";

fn junk(g: &mut Gen) -> Vec<u8> {
    match g.below(12) {
        0..=2 => g.pick(NUMBERS).as_bytes().to_vec(),
        3..=4 => g.pick(DURATIONS).as_bytes().to_vec(),
        5..=6 => g.pick(WORDS).as_bytes().to_vec(),
        7 => Vec::new(),
        8 => {
            let len = 1 + g.below(16);
            g.bytes(len)
        }
        9 => ((g.0)() as i64).to_string().into_bytes(),
        10 => g.pick(KEYS).as_bytes().to_vec(),
        // A megabyte, rarely: big arguments must be refused like small ones.
        _ if g.chance(5) => vec![b'7'; 1 << 20],
        _ => b"\x00\r\n$-1\r\n".to_vec(),
    }
}

fn word(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn options(g: &mut Gen, out: &mut Argv) {
    for _ in 0..g.below(3) {
        match g.below(4) {
            0 => out.extend([word("COST"), word(g.pick(&["0", "1", "2", "7"]))]),
            1 => out.push(word("DRYRUN")),
            2 => out.push(word("PARTIAL")),
            _ => out.extend([word("LOCKOUT"), word(g.pick(&["10ms", "1s"]))]),
        }
    }
}

/// A lease id: well formed (never granted, or rarely a guess) or not.
fn lease_id(g: &mut Gen) -> Vec<u8> {
    match g.below(5) {
        0..=2 => format!("{:016x}", (g.0)()).into_bytes(),
        3 => word(g.pick(&["0000000000000000", "ffffffffffffffff", "0123456789ABCDEF"])),
        _ => junk(g),
    }
}

/// A limiter spec as RL.ALL takes it (RL.POLICY.SET's when not `POLICY`).
/// A calendar window's period and its TZ and ANCHOR (RL.WINDOW).
fn calendar(g: &mut Gen) -> Argv {
    let mut out = vec![word(g.pick(&["day", "week", "month", "year"]))];
    if g.chance(50) {
        out.extend([
            word("TZ"),
            word(g.pick(&["UTC", "Europe/Berlin", "America/New_York", "Pacific/Apia"])),
        ]);
    }
    if g.chance(40) {
        out.extend([
            word("ANCHOR"),
            word(g.pick(&["1", "15", "31", "sun", "friday", "7"])),
        ]);
    }
    out
}

fn limiter(g: &mut Gen) -> Argv {
    let limit = word(g.pick(&["1", "3", "10"]));
    let period = word(g.pick(&["5ms", "100ms", "1h"]));
    match g.below(6) {
        0 => vec![word("TOKENBUCKET"), limit, word("1"), period],
        1 => vec![word("WINDOW"), limit, period],
        5 => [vec![word("WINDOW"), limit], calendar(g)].concat(),
        2 => vec![word("SLIDINGLOG"), limit, period],
        3 => vec![word("GCRA"), limit, word("1"), period],
        _ => vec![word("POLICY"), word(g.pick(POLICY_NAMES))],
    }
}

/// A well-formed call (which may still be refused: WRONGTYPE, ...).
fn valid(g: &mut Gen) -> Argv {
    let name = g.pick(COMMANDS);
    let key = word(g.pick(KEYS));
    let limit = word(g.pick(&["1", "3", "10"]));
    let period = word(g.pick(&["5ms", "100ms", "1s", "1h"]));
    let mut out = vec![word(name)];
    match name {
        "RL.ALL" => {
            let n = 1 + g.below(3);
            out.push(n.to_string().into_bytes());
            for i in 0..n {
                out.push(format!("{{f}}{}", ["tb", "w", "sl", "g", "x", "y"][(i + n) % 6]).into());
            }
            for _ in 0..n {
                out.extend(limiter(g));
            }
        }
        "RL.REFUND" => out.extend([key, word(g.pick(&["1", "5"]))]),
        "RL.UNLOCK" | "RL.PEEK" | "RL.INSPECT" => out.push(key),
        "RL.RELEASE" => out.extend([key, lease_id(g)]),
        "RL.LIMIT" => out.extend([key, word(g.pick(POLICY_NAMES))]),
        "RL.POLICY.SET" => {
            let name = if g.chance(90) { "p1" } else { "nope" };
            out.push(word(if g.chance(50) {
                name
            } else {
                g.pick(POLICY_NAMES)
            }));
            out.extend(limiter(g));
            if out[2] == b"WINDOW" && g.chance(30) {
                out.push(word("SLIDING"));
            }
            return out;
        }
        "RL.POLICY.DEL" | "RL.POLICY.GET" => {
            out.push(word(g.pick(POLICY_NAMES)));
            return out;
        }
        "RL.POLICY.LIST" => return out,
        "RL.POLICY.STATS" | "RL.POLICY.RESETSTATS" => {
            for _ in 0..g.below(3) {
                out.push(word(g.pick(POLICY_NAMES)));
            }
            return out;
        }
        "RL.TOPDENIED" => {
            if g.chance(70) {
                out.push(word(g.pick(&["1", "5", "10000", "0", "10001"])));
            }
            return out;
        }
        "RL.EXTEND" => out.extend([key, lease_id(g), period]),
        "RL.APPLY" => out.extend([key, junk(g)]),
        "RL.TOKENBUCKET" | "RL.GCRA" => out.extend([key, limit, word("1"), period]),
        "RL.THROTTLE" | "CL.THROTTLE" => {
            out.extend([key, limit, word("2"), word(g.pick(&["1", "60"]))]);
            return out;
        }
        "RL.WINDOW" if g.chance(30) => {
            out.extend([key, limit]);
            out.extend(calendar(g));
        }
        _ => out.extend([key, limit, period]),
    }
    if !matches!(
        name,
        "RL.REFUND"
            | "RL.UNLOCK"
            | "RL.PEEK"
            | "RL.INSPECT"
            | "RL.APPLY"
            | "RL.RELEASE"
            | "RL.EXTEND"
    ) {
        if name == "RL.WINDOW" && g.chance(50) {
            out.push(word("SLIDING"));
        }
        if name == "RL.SLIDINGLOG" && g.chance(50) {
            out.push(word("COUNTDENIED"));
        }
        options(g, &mut out);
    }
    out
}

/// A valid call with one to three arguments replaced, inserted, deleted or
/// repeated; or, a quarter of the time, a command name and random words.
fn case(g: &mut Gen) -> Argv {
    if g.chance(25) {
        let mut out = vec![word(g.pick(COMMANDS))];
        for _ in 0..g.below(9) {
            out.push(junk(g));
        }
        return out;
    }
    let mut out = valid(g);
    if g.chance(40) {
        // BLOCK only on calls left whole: a mutation could make it wait
        // with no timeout. A short wait is answered like any call.
        if g.chance(10) && !matches!(out[0].as_slice(), b"CL.THROTTLE" | b"RL.THROTTLE") {
            out.extend([word("BLOCK"), word(g.pick(&["5ms", "20ms"]))]);
        }
        return out;
    }
    for _ in 0..1 + g.below(3) {
        let at = 1 + g.below(out.len());
        match g.below(4) {
            0 if at < out.len() => out[at] = junk(g),
            1 if at < out.len() => {
                out.remove(at);
            }
            2 if at < out.len() => {
                let copy = out[at].clone();
                out.push(copy);
            }
            _ => out.insert(at.min(out.len()), junk(g)),
        }
    }
    out
}

fn cmd(argv: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::cmd(&String::from_utf8_lossy(&argv[0]));
    for arg in &argv[1..] {
        cmd.arg(arg.as_slice());
    }
    cmd
}

fn shown(argv: &[Vec<u8>]) -> String {
    let parts: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.len() > 40 {
                format!("<{} bytes>", a.len())
            } else {
                format!("{:?}", String::from_utf8_lossy(a))
            }
        })
        .collect();
    parts.join(" ")
}

/// Sends several commands in one round trip; error replies are values.
fn pipeline(con: &mut Connection, cmds: &[redis::Cmd]) -> Vec<Value> {
    let mut pipe = redis::pipe();
    for c in cmds {
        pipe.add_command(c.clone());
    }
    con.req_packed_commands(&pipe.get_packed_pipeline(), 0, cmds.len())
        .expect("the server answered")
}

/// What an error must leave alone: each fuzzed key's digest and expiry,
/// the key count, the replication offset; and the server time.
struct Snapshot {
    keys: Vec<(String, i64)>,
    /// RL.POLICY.GET of each of POLICY_NAMES.
    policies: Vec<Value>,
    dbsize: i64,
    offset: i64,
    time_ms: i64,
}

fn snapshot_cmds() -> Vec<redis::Cmd> {
    let mut cmds = Vec::new();
    for key in KEYS {
        // PEXPIRETIME first: it deletes a key whose time has passed (DEBUG
        // DIGEST-VALUE would still see it), so each pair agrees.
        cmds.push(to_cmd(&argv!["PEXPIRETIME", key]));
        cmds.push(to_cmd(&argv!["DEBUG", "DIGEST-VALUE", key]));
    }
    cmds.push(to_cmd(&argv!["DBSIZE"]));
    cmds.push(to_cmd(&argv!["INFO", "replication"]));
    cmds.push(to_cmd(&argv!["TIME"]));
    cmds.extend(policy_cmds());
    cmds
}

fn policy_cmds() -> Vec<redis::Cmd> {
    POLICY_NAMES
        .iter()
        .map(|name| to_cmd(&argv!["RL.POLICY.GET", name]))
        .collect()
}

fn policies(con: &mut Connection) -> Vec<Value> {
    pipeline(con, &policy_cmds())
}

fn snapshot(values: &[Value]) -> Snapshot {
    let keys = values[..2 * KEYS.len()]
        .chunks(2)
        .map(|pair| (string(&array(&pair[1])[0]), int(&pair[0])))
        .collect();
    let rest = &values[2 * KEYS.len()..];
    let time = array(&rest[2]);
    let (secs, micros): (i64, i64) = (
        string(&time[0]).parse().unwrap(),
        string(&time[1]).parse().unwrap(),
    );
    Snapshot {
        keys,
        policies: rest[3..].to_vec(),
        dbsize: int(&rest[0]),
        offset: offset_of(&rest[1]),
        time_ms: secs * 1000 + micros / 1000,
    }
}

/// An error changed nothing, except that the server may have expired a key
/// whose time had come (lazily, when the command looked it up, or in its
/// expiry cycle between the reads of a long pipeline); that deletion is
/// replicated, so it may move the offset.
fn unchanged_but_for_expiry(before: &Snapshot, after: &Snapshot, context: &str) {
    let mut expired = 0;
    for ((key, (d0, t0)), (d1, _)) in KEYS.iter().zip(&before.keys).zip(&after.keys) {
        if d0 != d1 {
            let absent = d1.bytes().all(|b| b == b'0');
            assert!(
                *t0 >= 0 && *t0 <= after.time_ms && absent,
                "{context}: an error changed key {key}: digest {d0} -> {d1}, expiry at {t0}, time {} -> {}",
                before.time_ms,
                after.time_ms
            );
            expired += 1;
        }
    }
    assert_eq!(
        before.policies, after.policies,
        "{context}: an error changed a stored policy"
    );
    // Other keys (made by earlier fuzzed calls) may expire meanwhile too, so
    // the count may drop; an error must never add a key.
    assert!(
        after.dbsize <= before.dbsize,
        "{context}: an error created a key"
    );
    let expired_any = expired > 0 || after.dbsize < before.dbsize;
    assert!(
        after.offset == before.offset || expired_any,
        "{context}: an error propagated something"
    );
}

fn offset_of(v: &Value) -> i64 {
    field(&string(v), "master_repl_offset")
        .expect("master_repl_offset")
        .parse()
        .unwrap()
}

fn check_error_text(error: &str, context: &str) {
    assert!(
        error.starts_with("ERR") || error.starts_with("WRONGTYPE"),
        "{context}: error does not start with ERR or WRONGTYPE: {error}"
    );
}

fn set_foreign_keys(con: &mut Connection) {
    q(con, &argv!["SET", "str", STRING_VALUE]);
    q(con, &argv!["HSET", "hash", "f", "v"]);
}

fn foreign_keys_intact(con: &mut Connection, context: &str) {
    assert_eq!(
        string(&q(con, &argv!["GET", "str"])),
        STRING_VALUE,
        "{context}"
    );
    assert_eq!(
        string(&q(con, &argv!["HGET", "hash", "f"])),
        "v",
        "{context}"
    );
}

/// Keys that will not expire in the next 10 s (those about to expire may
/// differ for a moment between copies: a primary drops expired keys when it
/// loads an RDB, and a replica waits for the primary's DEL).
fn durable_keys(con: &mut Connection, now: i64) -> Vec<String> {
    let mut keys: Vec<String> = array(&q(con, &argv!["KEYS", "*"]))
        .iter()
        .map(string)
        .filter(|key| {
            let at = pexpiretime(con, key);
            at == -1 || at > now + 10_000
        })
        .collect();
    keys.sort();
    keys
}

/// The replica ends equal: the same keys, each with the same digest and
/// expiry.
fn replica_equal(primary: &Server, replica: &Server, context: &str) {
    let (mut p, mut r) = (primary.conn(), replica.conn());
    sync_replica(primary, replica);
    let now = server_time_ms(&mut p);
    let keys = durable_keys(&mut p, now);
    assert_eq!(durable_keys(&mut r, now), keys, "{context}: replica keys");
    let (on_replica, on_primary) = (
        digests_and_expiries(&mut r, &keys),
        digests_and_expiries(&mut p, &keys),
    );
    let differ: Vec<String> = keys
        .iter()
        .zip(on_replica.iter().zip(&on_primary))
        .filter(|(_, (a, b))| a != b)
        .map(|(key, (a, b))| format!("{key:?}: replica {a:?}, primary {b:?}"))
        .collect();
    assert!(
        differ.is_empty(),
        "{context}: replica values differ: {differ:#?}"
    );
    assert_eq!(
        policies(&mut r),
        policies(&mut p),
        "{context}: replica policies"
    );
}

/// DEBUG RELOAD (an RDB round trip) keeps every key that is not about to
/// expire exactly (a primary does not load keys whose time has passed, so
/// the whole-dataset digest may lose those).
fn reload_keeps_state(con: &mut Connection, context: &str) {
    let now = server_time_ms(con);
    let keys = durable_keys(con, now);
    let before = digests_and_expiries(con, &keys);
    let defined = policies(con);
    q(con, &argv!["DEBUG", "RELOAD"]);
    assert_eq!(
        policies(con),
        defined,
        "{context}: DEBUG RELOAD changed a policy"
    );
    assert_eq!(
        digests_and_expiries(con, &keys),
        before,
        "{context}: DEBUG RELOAD changed a key"
    );
}

#[test]
fn fuzz_commands() {
    let seed = seed(1);
    let total = cases(3_000);
    let (mut primary, replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    set_foreign_keys(&mut con);
    let mut g = Gen::new(seed);
    let (mut errors, mut replies) = (0u64, 0u64);
    let state = snapshot_cmds();
    for n in 0..total {
        let argv = case(&mut g);
        let context = format!("seed {seed} case {n}: {}", shown(&argv));
        let mut cmds = state.clone();
        cmds.push(cmd(&argv));
        cmds.extend(state.iter().cloned());
        let out = pipeline(&mut con, &cmds);
        let (before, rest) = out.split_at(state.len());
        if let Some(error) = error_of(&rest[0]) {
            errors += 1;
            if let Ok(trace) = std::env::var("RL_FUZZ_TRACE") {
                if argv.iter().any(|a| a == trace.as_bytes()) {
                    eprintln!("TRACE {context} -> {error}");
                }
            }
            check_error_text(&error, &context);
            unchanged_but_for_expiry(&snapshot(before), &snapshot(&rest[1..]), &context);
        } else {
            replies += 1;
            if let Ok(trace) = std::env::var("RL_FUZZ_TRACE") {
                if argv.iter().any(|a| a == trace.as_bytes()) {
                    eprintln!("TRACE {context} -> {:?}", rest[0]);
                }
            }
        }
        if n % 250 == 249 {
            primary.assert_alive();
            foreign_keys_intact(&mut con, &context);
            replica_equal(&primary, &replica, &context);
        }
        if n % 1000 == 999 {
            reload_keeps_state(&mut con, &context);
        }
    }
    primary.assert_alive();
    foreign_keys_intact(&mut con, "end");
    replica_equal(&primary, &replica, "end");
    eprintln!("fuzz_commands: seed {seed}, {total} cases, {errors} errors, {replies} replies");
    assert!(
        errors > total / 10 && replies > total / 10,
        "the mix lost its variety"
    );
}

/// Limiters of every kind, as DUMP payloads: fresh, used, denied, locked,
/// a sliding log of many entries.
fn sample_dumps(con: &mut Connection) -> Vec<Vec<u8>> {
    // The module's bytes stay uncompressed in a DUMP, so that its fields can
    // be set one by one.
    q(con, &argv!["CONFIG", "SET", "rdbcompression", "no"]);
    let mut keys = Vec::new();
    for algo in Algo::ALL {
        let key = format!("src:{}", algo.name());
        for _ in 0..4 {
            rl(con, &algo.cmd(&key, 3, "1h"));
        }
        keys.push(key.clone());
        let locked = format!("src:locked:{}", algo.name());
        rl(con, &algo.cmd(&locked, 1, "1h"));
        rl(con, &algo.cmd_with(&locked, 1, "1h", &["LOCKOUT", "1h"]));
        keys.push(locked);
    }
    for i in 0..300 {
        rl(
            con,
            &argv!["RL.SLIDINGLOG", "src:log", 1000, "1h", "COST", 1 + i % 3],
        );
        if i % 50 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    keys.push("src:log".into());
    q(con, &argv!["CL.THROTTLE", "src:cell", 5, 10, 60, 3]);
    keys.push("src:cell".into());
    q(
        con,
        &argv![
            "RL.WINDOW",
            "src:cal",
            5,
            "month",
            "TZ",
            "Europe/Berlin",
            "ANCHOR",
            31,
            "COST",
            2
        ],
    );
    keys.push("src:cal".into());
    for cost in [1, 2, 1] {
        q(con, &argv!["RL.LEASE", "src:lease", 5, "1h", "COST", cost]);
    }
    keys.push("src:lease".into());
    let mut dumps: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| dump(con, k).expect("a limiter"))
        .collect();
    // States only RESTORE makes (no command leaves a lease limiter without
    // leases: its key expires), whose fields a mutation can move to a bound
    // that still loads: an empty lease limiter, one with a single lease.
    let now = server_time_ms(con) as u64;
    let template = dumps.last().expect("the lease sample").clone();
    for fields in [vec![5, now, 0], vec![5, now, 1, 7, now + 3_600_000, 1]] {
        let mut codec = vec![1u8, 7];
        for field in fields {
            codec.extend_from_slice(&field.to_le_bytes());
        }
        dumps.push(dump_with_codec(&template, &codec));
    }
    dumps
}

/// One or two mutations: a bit flip, an inserted or deleted byte, a
/// truncation, or 1-8 bytes overwritten with an edge pattern.
fn mutate(g: &mut Gen, body: &mut Vec<u8>) {
    for _ in 0..1 + g.below(2) {
        if body.is_empty() {
            break;
        }
        let at = g.below(body.len());
        match g.below(5) {
            0 => body[at] ^= 1 << g.below(8),
            1 => body.insert(at, (g.0)() as u8),
            2 => {
                body.remove(at);
            }
            3 => body.truncate(at),
            _ => {
                let width = g.pick(&[1usize, 2, 4, 8]);
                let pattern = g.pick(&[0x00u8, 0xff, 0x7f, 0x80, 0x01]);
                for b in body.iter_mut().skip(at).take(width) {
                    *b = pattern;
                }
            }
        }
    }
}

/// Values at and around every bound of the stored format (src/core/bounds.rs):
/// the latest time and deadline, the largest count and lease limit, the
/// longest period, and the extremes of a word.
const MAX_TIME: u64 = 1 << 53;
const MAX_PERIOD: u64 = 3650 * 86_400_000;
const EDGES: &[u64] = &[
    0,
    1,
    2,
    MAX_TIME - 1,
    MAX_TIME,
    MAX_TIME + 1,
    MAX_TIME - MAX_PERIOD,
    MAX_TIME + MAX_PERIOD,
    MAX_TIME + MAX_PERIOD + 1,
    MAX_PERIOD,
    MAX_PERIOD + 1,
    MAX_COUNT,
    MAX_COUNT + 1,
    100_000,
    100_001,
    u64::MAX,
    1 << 63,
];

/// One 8-byte field of the module's bytes (at its offset in the layout of
/// src/core/codec.rs) set to a bound, or moved from its value by a day, the
/// longest period, or just past it: the values at the edge of what the
/// loader accepts, where a command on the loaded value could step outside.
fn mutate_field(g: &mut Gen, codec: &mut [u8]) {
    let fields = codec.len().saturating_sub(2) / 8;
    if fields == 0 {
        return;
    }
    let at = 2 + 8 * g.below(fields);
    let old = u64::from_le_bytes(codec[at..at + 8].try_into().unwrap());
    let value = match g.below(3) {
        0 => g.pick(EDGES),
        1 => old.wrapping_add(g.pick(&[1, 86_400_000, MAX_PERIOD, MAX_PERIOD + 1])),
        _ => old.wrapping_sub(g.pick(&[1, 86_400_000, MAX_PERIOD, MAX_PERIOD + 1, 2 * MAX_PERIOD])),
    };
    codec[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// A mutated DUMP payload, its CRC made valid again so that the module's
/// own decoding is what gets tested: half the time raw byte mutations
/// anywhere in the payload, half the time one or two fields of the
/// module's bytes set at or near a bound.
fn mutate_dump(g: &mut Gen, payload: &[u8]) -> Vec<u8> {
    if g.chance(50) {
        let (start, len) = codec_span(payload);
        let mut codec = payload[start..start + len].to_vec();
        for _ in 0..1 + g.below(2) {
            mutate_field(g, &mut codec);
        }
        return dump_with_codec(payload, &codec);
    }
    // Body, then the 2-byte RDB version and the 8-byte CRC.
    let body_len = payload.len() - 10;
    let mut body = payload[..body_len].to_vec();
    mutate(g, &mut body);
    body.extend_from_slice(&payload[body_len..]);
    fix_dump_crc(&mut body);
    body
}

/// Every command on a key that holds whatever loaded: replies or clean
/// errors, and DUMP/RESTORE gives it back identical (a value the module
/// accepted, then changed, must still be one it accepts).
fn exercise_loaded(con: &mut Connection, key: &str, context: &str) {
    // A lease granted now and extended for the longest TTL; half of them
    // released again (the id is random).
    if let Ok(Value::Array(reply)) = try_q(con, &argv!["RL.LEASE", key, 100_000, "3650d"]) {
        if let Some(Value::BulkString(id)) = reply.get(5) {
            let id = String::from_utf8_lossy(id).to_string();
            q(con, &argv!["RL.EXTEND", key, &id, "3650d"]);
            if id.as_bytes()[15].is_multiple_of(2) {
                q(con, &argv!["RL.RELEASE", key, &id]);
            }
        }
    }
    let mut calls: Vec<Vec<String>> = vec![
        argv!["RL.PEEK", key],
        argv!["RL.REFUND", key, 1],
        argv!["RL.UNLOCK", key],
        argv!["CL.THROTTLE", key, 3, 1, 60],
        argv!["RL.ALL", 1, key, "WINDOW", 3, "1h"],
        argv!["RL.LEASE", key, 3, "1h"],
        argv!["RL.LEASE", key, 3, "1h", "COST", 0],
        argv![
            "RL.WINDOW",
            key,
            3,
            "month",
            "TZ",
            "Europe/Berlin",
            "ANCHOR",
            31
        ],
        argv![
            "RL.WINDOW",
            key,
            MAX_COUNT,
            "week",
            "ANCHOR",
            "sun",
            "COST",
            2,
            "LOCKOUT",
            "3650d"
        ],
        argv!["RL.RELEASE", key, "0123456789abcdef"],
        argv!["RL.EXTEND", key, "0123456789abcdef", "1h"],
        argv!["MEMORY", "USAGE", key],
        argv!["DEBUG", "DIGEST-VALUE", key],
        argv!["PTTL", key],
    ];
    for algo in Algo::ALL {
        calls.push(algo.cmd_with(key, 3, "1h", &["COST", "0"]));
        calls.push(algo.cmd_with(key, 3, "1h", &["DRYRUN"]));
        calls.push(algo.cmd(key, 3, "1h"));
        calls.push(algo.cmd_with(key, 1, "3650d", &["COST", "2", "LOCKOUT", "3650d"]));
        calls.push(algo.cmd_with(
            key,
            MAX_COUNT,
            "3650d",
            &["COST", &MAX_COUNT.to_string(), "PARTIAL"],
        ));
        calls.push(argv!["RL.REFUND", key, MAX_COUNT]);
    }
    for call in &calls {
        if let Err(error) = try_q(con, call) {
            check_error_text(&error, &format!("{context}: {call:?}"));
            assert!(
                !error.contains("internal error"),
                "{context}: {call:?}: {error}"
            );
        }
    }
    // Taken before the DUMP: the key may reach its expiry meanwhile.
    let expiry = pexpiretime(con, key);
    let original = digest(con, key);
    let all_zero = original.bytes().all(|b| b == b'0');
    if let Some(payload) = dump(con, key).filter(|_| expiry != -2 && !all_zero) {
        let copy = format!("{key}:copy");
        // DEBUG DIGEST-VALUE mixes in whether the key has an expiry (not
        // when): the copy gets one too, an hour ahead at least, so that it
        // cannot expire before it is compared.
        let at = if expiry > 0 {
            expiry.max(server_time_ms(con) + ONE_HOUR_MS)
        } else {
            0
        };
        let mut restore = to_cmd(&argv!["RESTORE", copy, at]);
        restore.arg(payload.as_slice()).arg("REPLACE").arg("ABSTTL");
        let reply = raw_cmd(con, &restore);
        assert_eq!(
            error_of(&reply),
            None,
            "{context}: re-RESTORE of its own DUMP"
        );
        assert_eq!(
            original,
            digest(con, &copy),
            "{context}: DUMP round trip of {payload:02x?}"
        );
        q(con, &argv!["DEL", copy]);
    }
}

#[test]
fn fuzz_restore_of_mutated_dumps() {
    let seed = seed(2);
    let total = cases(1_500);
    let mut server = Server::start();
    let mut con = server.conn();
    let samples = sample_dumps(&mut con);
    let mut g = Gen::new(seed);
    let (mut refused, mut loaded) = (0u64, 0u64);
    for n in 0..total {
        let sample = g.below(samples.len());
        let payload = mutate_dump(&mut g, &samples[sample]);
        let key = format!("fz{}", n % 50);
        let context = format!("seed {seed} case {n}");
        q(&mut con, &argv!["DEL", key]);
        let mut restore = to_cmd(&argv!["RESTORE", key, 0]);
        restore.arg(payload.as_slice());
        let reply = raw_cmd(&mut con, &restore);
        match error_of(&reply) {
            Some(error) => {
                refused += 1;
                check_error_text(&error, &context);
                assert!(
                    !exists(&mut con, &key),
                    "{context}: a refused RESTORE left the key"
                );
            }
            None => {
                loaded += 1;
                exercise_loaded(&mut con, &key, &context);
            }
        }
        if n % 100 == 99 {
            reload_keeps_state(&mut con, &context);
        }
    }
    // Whatever loaded is saved and loaded again by a restart.
    server.restart(Shutdown::Save);
    let mut con = server.conn();
    for n in 0..50 {
        let key = format!("fz{n}");
        if exists(&mut con, &key) {
            exercise_loaded(&mut con, &key, &format!("after restart: {key}"));
        }
    }
    eprintln!(
        "fuzz_restore: seed {seed}, {total} mutated payloads, {refused} refused, {loaded} loaded"
    );
    assert!(
        refused > 0 && loaded > 0,
        "the mutations lost their variety"
    );
}

/// Reads every `RL.APPLY key effect` an append-only file holds.
fn applied_effects(dir: &Path) -> Vec<Vec<u8>> {
    let mut effects = Vec::new();
    let aof_dir = dir.join("appendonlydir");
    for entry in fs::read_dir(&aof_dir).expect("appendonlydir") {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".incr.aof") {
            continue;
        }
        let data = fs::read(&path).unwrap();
        let mut at = 0;
        while let Some(argv) = resp_array(&data, &mut at) {
            if argv.len() == 3 && argv[0].eq_ignore_ascii_case(b"rl.apply") {
                effects.push(argv[2].clone());
            }
        }
    }
    effects
}

/// One `*N\r\n($len\r\n bytes\r\n)*N` array from `data` at `at`.
fn resp_array(data: &[u8], at: &mut usize) -> Option<Argv> {
    fn line(data: &[u8], at: &mut usize, prefix: u8) -> Option<usize> {
        if data.get(*at) != Some(&prefix) {
            return None;
        }
        let end = *at + data[*at..].windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&data[*at + 1..end])
            .ok()?
            .parse()
            .ok()?;
        *at = end + 2;
        Some(n)
    }
    let count = line(data, at, b'*')?;
    let mut argv = Vec::with_capacity(count);
    for _ in 0..count {
        let len = line(data, at, b'$')?;
        argv.push(data.get(*at..*at + len)?.to_vec());
        *at += len + 2;
    }
    Some(argv)
}

/// INFO `expired_keys`: keys the server has expired so far.
fn expired_keys(con: &mut Connection) -> i64 {
    field(&info(con, "stats"), "expired_keys")
        .and_then(|v| v.parse().ok())
        .expect("expired_keys")
}

#[test]
fn fuzz_apply_of_mutated_effects() {
    let seed = seed(3);
    let total = cases(2_000);
    let server = Server::start_with(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut con = server.conn();
    // Every kind of effect: replacements of each algorithm (locked too),
    // sliding log records and refunds.
    sample_dumps(&mut con);
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "src:cd", 1, "1h", "COUNTDENIED"],
    );
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "src:cd", 1, "1h", "COUNTDENIED"],
    );
    q(&mut con, &argv!["RL.REFUND", "src:log", 2]);
    q(&mut con, &argv!["RL.REFUND", "src:token bucket", 2]);
    q(&mut con, &argv!["RL.UNLOCK", "src:locked:GCRA"]);
    // Lease grants, a release and an extension.
    let grant = q(&mut con, &argv!["RL.LEASE", "src:lease", 5, "1h"]);
    let id = string(&array(&grant)[5]);
    q(&mut con, &argv!["RL.EXTEND", "src:lease", &id, "2h"]);
    q(&mut con, &argv!["RL.RELEASE", "src:lease", &id]);
    let effects = applied_effects(server.dir());
    assert!(
        effects.len() > 20,
        "only {} effects in the AOF",
        effects.len()
    );
    set_foreign_keys(&mut con);
    q(&mut con, &argv!["RPUSH", "list", "a"]);
    let mut g = Gen::new(seed);
    let targets = [
        "absent",
        "str",
        "hash",
        "list",
        "src:log",
        "src:fixed window",
        "src:GCRA",
        "src:lease",
        "lim",
    ];
    let (mut refused, mut applied, mut expired_meanwhile) = (0u64, 0u64, 0u64);
    for n in 0..total {
        let mut effect = effects[g.below(effects.len())].clone();
        if g.chance(75) {
            mutate(&mut g, &mut effect);
        }
        let target = g.pick(&targets);
        let context = format!("seed {seed} case {n} on {target}");
        let expired_before = expired_keys(&mut con);
        let before = string(&q(&mut con, &argv!["DEBUG", "DIGEST"]));
        let mut apply = to_cmd(&argv!["RL.APPLY", target]);
        apply.arg(effect.as_slice());
        let reply = raw_cmd(&mut con, &apply);
        match error_of(&reply) {
            Some(error) => {
                refused += 1;
                check_error_text(&error, &context);
                let after = string(&q(&mut con, &argv!["DEBUG", "DIGEST"]));
                // The server expiring a key meanwhile (its own cycle, or the
                // lookup) moves the digest too; such a case proves nothing.
                if expired_keys(&mut con) == expired_before {
                    assert_eq!(
                        before, after,
                        "{context}: a refused RL.APPLY changed the dataset"
                    );
                } else {
                    expired_meanwhile += 1;
                }
            }
            None => {
                applied += 1;
                exercise_loaded(&mut con, target, &context);
            }
        }
        foreign_keys_intact(&mut con, &context);
        assert_eq!(
            array(&q(&mut con, &argv!["LRANGE", "list", 0, -1])).len(),
            1,
            "{context}"
        );
        if target == "absent" {
            q(&mut con, &argv!["DEL", "absent"]);
        }
    }
    eprintln!(
        "fuzz_apply: seed {seed}, {total} effects, {refused} refused ({expired_meanwhile} with a key expired meanwhile, not compared), {applied} applied"
    );
    assert!(
        expired_meanwhile <= refused / 10,
        "too few refusals compared"
    );
    assert!(
        refused > 0 && applied > 0,
        "the mutations lost their variety"
    );
}
