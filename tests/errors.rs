//! Bad input: every error class on every command, with its text; the key is
//! untouched, nothing is propagated, and the server keeps answering.

mod common;

use common::*;
use redis::{Connection, Value};
use std::fs;
use std::path::Path;

const COUNT_ERR: &str = "must be an integer from 1 to 1000000000000000";
const DURATION_ERR: &str = "must be a duration from 1ms to 3650d";
const COST_ERR: &str = "ERR COST must be an integer from 0 to 1000000000000000";

const BAD_COUNTS: &[&str] = &[
    "0",
    "-1",
    "1000000000000001",
    "18446744073709551616",
    "99999999999999999999",
    "abc",
    "",
    "1.5",
    "1e3",
    "+5",
    " 5",
    "5 ",
    "0x10",
];

const BAD_DURATIONS: &[&str] = &[
    "0",
    "0ms",
    "0s",
    "3651d",
    "315360001",
    "315360000001ms",
    "87601h",
    "1w",
    "-1",
    "-1s",
    "",
    "1.5s",
    "s",
    "ms",
    "10 s",
    " 10",
    "1sms",
    "99999999999999999999",
    "99999999999999999999ms",
    "18446744073709551616ms",
];

const BAD_COSTS: &[&str] = &[
    "-1",
    "abc",
    "1000000000000001",
    "",
    "1.5",
    "99999999999999999999",
    "+1",
];

/// One command's shape.
struct Shape {
    name: &'static str,
    lower: &'static str,
    /// (argument name, good value, is a duration)
    positionals: &'static [(&'static str, &'static str, bool)],
    flag: Option<&'static str>,
    algo: Algo,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "RL.TOKENBUCKET",
        lower: "rl.tokenbucket",
        positionals: &[
            ("capacity", "10", false),
            ("refill_amount", "1", false),
            ("refill_period", "1h", true),
        ],
        flag: None,
        algo: Algo::TokenBucket,
    },
    Shape {
        name: "RL.WINDOW",
        lower: "rl.window",
        positionals: &[("limit", "10", false), ("period", "1h", true)],
        flag: None,
        algo: Algo::FixedWindow,
    },
    Shape {
        name: "RL.WINDOW",
        lower: "rl.window",
        positionals: &[("limit", "10", false), ("period", "1h", true)],
        flag: Some("SLIDING"),
        algo: Algo::SlidingWindow,
    },
    Shape {
        name: "RL.SLIDINGLOG",
        lower: "rl.slidinglog",
        positionals: &[("limit", "10", false), ("period", "1h", true)],
        flag: Some("COUNTDENIED"),
        algo: Algo::SlidingLog,
    },
    Shape {
        name: "RL.GCRA",
        lower: "rl.gcra",
        positionals: &[
            ("burst", "10", false),
            ("rate", "1", false),
            ("period", "1h", true),
        ],
        flag: None,
        algo: Algo::Gcra,
    },
];

impl Shape {
    fn good(&self, key: &str) -> Vec<String> {
        let mut cmd = argv![self.name, key];
        cmd.extend(self.positionals.iter().map(|p| p.1.to_string()));
        if let Some(flag) = self.flag {
            // Only the sliding window needs its flag to be the same algorithm.
            if self.algo == Algo::SlidingWindow {
                cmd.push(flag.to_string());
            }
        }
        cmd
    }

    /// (command, expected error prefix)
    fn bad_cases(&self, key: &str) -> Vec<(Vec<String>, String)> {
        let mut cases = Vec::new();
        // Too few arguments: the server's arity check.
        let arity = format!("ERR wrong number of arguments for '{}' command", self.lower);
        for n in 0..=self.positionals.len() {
            let mut cmd = argv![self.name];
            if n > 0 {
                cmd.push(key.to_string());
                cmd.extend(self.positionals[..n - 1].iter().map(|p| p.1.to_string()));
            }
            cases.push((cmd, arity.clone()));
        }
        // Each positional out of range.
        for (i, (name, _, is_duration)) in self.positionals.iter().enumerate() {
            let bad: &[&str] = if *is_duration {
                BAD_DURATIONS
            } else {
                BAD_COUNTS
            };
            let what = if *is_duration {
                DURATION_ERR
            } else {
                COUNT_ERR
            };
            for value in bad {
                let mut cmd = self.good(key);
                cmd[2 + i] = value.to_string();
                cases.push((cmd, format!("ERR {name} {what}")));
            }
        }
        let with = |options: &[&str]| {
            let mut cmd = self.good(key);
            cmd.extend(options.iter().map(|s| s.to_string()));
            cmd
        };
        for cost in BAD_COSTS {
            cases.push((with(&["COST", cost]), COST_ERR.to_string()));
            cases.push((with(&["DRYRUN", "cost", cost]), COST_ERR.to_string()));
        }
        cases.push((with(&["COST"]), "ERR COST must be followed by".to_string()));
        cases.push((
            with(&["DRYRUN", "COST"]),
            "ERR COST must be followed by".to_string(),
        ));
        cases.push((
            with(&["DRYRUN", "DRYRUN"]),
            "ERR option DRYRUN is given more than once".to_string(),
        ));
        cases.push((
            with(&["dryrun", "COST", "1", "DryRun"]),
            "ERR option DRYRUN is given more than once".to_string(),
        ));
        cases.push((
            with(&["COST", "1", "COST", "2"]),
            "ERR option COST is given more than once".to_string(),
        ));
        if let Some(flag) = self.flag {
            let mut cmd = with(&[flag]);
            if self.algo != Algo::SlidingWindow {
                cmd.push(flag.to_lowercase());
            }
            cases.push((cmd, format!("ERR option {flag} is given more than once")));
        }
        let foreign: &[&str] = match self.algo {
            Algo::TokenBucket | Algo::Gcra => &["FOO", "SLIDING", "COUNTDENIED", "5", "NX"],
            Algo::FixedWindow | Algo::SlidingWindow => &["FOO", "COUNTDENIED", "5"],
            Algo::SlidingLog => &["FOO", "SLIDING", "5"],
        };
        for word in foreign {
            cases.push((
                with(&[word]),
                format!("ERR unknown option '{word}' (expected"),
            ));
            cases.push((
                with(&["DRYRUN", word]),
                format!("ERR unknown option '{word}' (expected"),
            ));
            cases.push((
                with(&["COST", "1", word]),
                format!("ERR unknown option '{word}' (expected"),
            ));
        }
        cases.push((
            with(&["foo"]),
            "ERR unknown option 'foo' (expected".to_string(),
        ));
        cases
    }
}

fn assert_error(con: &mut Connection, cmd: &[String], prefix: &str) {
    let e = q_err(con, cmd);
    assert!(
        e.starts_with(prefix),
        "{cmd:?}\n  expected an error starting with: {prefix}\n  got: {e}"
    );
}

/// Runs `cmd`, expects an error starting with `prefix`, and checks that
/// `key` and the replication offset did not change.
fn assert_rejected(con: &mut Connection, cmd: &[String], prefix: &str, key: &str) {
    let state = key_state(con, key);
    let offset = repl_offset(con);
    assert_error(con, cmd, prefix);
    assert_eq!(key_state(con, key), state, "{cmd:?} changed {key}");
    assert_eq!(repl_offset(con), offset, "{cmd:?} moved master_repl_offset");
}

fn populate(con: &mut Connection) {
    for shape in SHAPES {
        let key = format!("k:{:?}", shape.algo);
        let mut cmd = shape.good(&key);
        cmd.extend(argv!["COST", 3]);
        rl(con, &cmd);
    }
    q(con, &argv!["SET", "str", "value"]);
    q(con, &argv!["RPUSH", "list", "a", "b"]);
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 120_000);
    populate(&mut con);
    let mut checked = 0;
    for shape in SHAPES {
        let existing = format!("k:{:?}", shape.algo);
        for key in [existing.as_str(), "absent"] {
            for (cmd, prefix) in shape.bad_cases(key) {
                assert_rejected(&mut con, &cmd, &prefix, key);
                checked += 1;
            }
            assert!(!exists(&mut con, "absent"));
        }
    }
    eprintln!("{checked} bad commands refused");
    let mut primary = primary;
    primary.assert_alive();
}

/// Also from inside MULTI/EXEC and a script the errors come back as errors
/// (and the transaction's other commands run).
#[test]
fn errors_inside_multi_and_scripts() {
    let server = Server::start();
    let mut con = server.conn();
    let items = exec(
        &mut con,
        &[
            argv!["RL.TOKENBUCKET", "m", 0, 1, "1h"],
            argv!["RL.TOKENBUCKET", "m", 2, 1, "1h"],
            argv!["RL.WINDOW", "m", 2, "1h"],
        ],
    );
    let e = error_of(&items[0]).unwrap_or_else(|| panic!("expected an error: {:?}", items[0]));
    assert!(e.starts_with("ERR capacity must be"), "{e}");
    assert!(Reply::parse(&items[1]).allowed);
    let e = error_of(&items[2]).unwrap_or_else(|| panic!("expected WRONGTYPE: {:?}", items[2]));
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let e = q_err(
        &mut con,
        &argv![
            "EVAL",
            "return server.call('RL.WINDOW', KEYS[1], '0', '1h')",
            1,
            "s"
        ],
    );
    assert!(e.contains("limit must be"), "{e}");
    let v = q(
        &mut con,
        &argv![
            "EVAL",
            "local r = server.pcall('RL.WINDOW', KEYS[1], '5', 'soon'); return r['err']",
            1,
            "s"
        ],
    );
    assert!(string(&v).contains("period must be a duration"), "{v:?}");
    assert!(!exists(&mut con, "s"));
}

#[test]
fn wrongtype_on_other_types() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    populate(&mut con);
    for key in ["str", "list"] {
        for algo in Algo::ALL {
            for options in [
                &[][..],
                &["DRYRUN"][..],
                &["COST", "0"][..],
                &["COST", "99"][..],
            ] {
                let cmd = algo.cmd_with(key, 10, "1h", options);
                assert_rejected(&mut con, &cmd, "WRONGTYPE", key);
            }
        }
    }
    assert_eq!(string(&q(&mut con, &argv!["GET", "str"])), "value");
    assert_eq!(int(&q(&mut con, &argv!["LLEN", "list"])), 2);
}

#[test]
fn wrongtype_on_another_algorithm() {
    let (primary, _replica) = primary_and_replica(&[]);
    let mut con = primary.conn();
    avoid_boundary(&mut con, ONE_HOUR_MS, 120_000);
    populate(&mut con);
    for owner in Algo::ALL {
        let key = format!("k:{owner:?}");
        for other in Algo::ALL.into_iter().filter(|a| *a != owner) {
            for options in [
                &[][..],
                &["DRYRUN"][..],
                &["COST", "0"][..],
                &["COST", "99"][..],
            ] {
                let cmd = other.cmd_with(&key, 10, "1h", options);
                assert_rejected(&mut con, &cmd, "WRONGTYPE", &key);
            }
        }
        // The right command still works on it.
        let r = rl(&mut con, &owner.cmd_with(&key, 10, "1h", &["DRYRUN"]));
        assert!(r.allowed && r.remaining == 6, "{}: {r:?}", owner.name());
    }
    let mut primary = primary;
    primary.assert_alive();
}

// ---------------------------------------------------------------------------
// RL.APPLY is internal, but a client can call it: it must refuse what it
// cannot verify and never crash.

/// Parses the RESP commands of an AOF file (skipping anything else).
fn aof_commands(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line(bytes: &[u8], pos: &mut usize) -> Option<Vec<u8>> {
        let start = *pos;
        let end = start + bytes[start..].windows(2).position(|w| w == b"\r\n")?;
        *pos = end + 2;
        Some(bytes[start..end].to_vec())
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        if bytes[pos] != b'*' {
            // An RDB preamble or something else: skip to the next line.
            if line(bytes, &mut pos).is_none() {
                break;
            }
            continue;
        }
        let Some(head) = line(bytes, &mut pos) else {
            break;
        };
        let Ok(n) = String::from_utf8_lossy(&head[1..]).parse::<usize>() else {
            continue;
        };
        let mut argv = Vec::new();
        for _ in 0..n {
            let Some(len_line) = line(bytes, &mut pos) else {
                return out;
            };
            let Ok(len) = String::from_utf8_lossy(&len_line[1..]).parse::<usize>() else {
                return out;
            };
            if pos + len + 2 > bytes.len() {
                return out;
            }
            argv.push(bytes[pos..pos + len].to_vec());
            pos += len + 2;
        }
        out.push(argv);
    }
    out
}

fn aof_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(aof_files(&path));
        } else if path.extension().is_some_and(|e| e == "aof") {
            files.push(fs::read(&path).unwrap_or_default());
        }
    }
    files
}

fn apply(con: &mut Connection, key: &str, blob: &[u8]) -> Value {
    raw_cmd(con, redis::cmd("RL.APPLY").arg(key).arg(blob))
}

/// After a mutated RL.APPLY was accepted: the key must be a usable limiter.
fn exercise(con: &mut Connection, key: &str, what: &str) {
    let state = key_state(con, key);
    if !state.exists {
        return;
    }
    assert_eq!(state.kind, "ratelimit", "{what}");
    q(con, &argv!["MEMORY", "USAGE", key]);
    let mut worked = 0;
    for algo in Algo::ALL {
        for options in [&["DRYRUN"][..], &["COST", "0"][..], &[][..]] {
            match try_q(con, &algo.cmd_with(key, 7, "1h", options)) {
                Ok(v) => {
                    Reply::parse(&v);
                    worked += 1;
                }
                Err(e) => assert!(e.starts_with("WRONGTYPE"), "{what}: {e}"),
            }
        }
    }
    assert!(worked > 0, "{what}: accepted state that no command can use");
    q(con, &argv!["COPY", key, "copy-of-applied", "REPLACE"]);
    q(con, &argv!["DEL", key, "copy-of-applied"]);
}

#[test]
fn rl_apply_refuses_garbage() {
    // Real RL.APPLY blobs, taken from an AOF.
    let aof = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = aof.conn();
    for algo in Algo::ALL {
        let key = format!("src:{algo:?}");
        for cost in [1, 2, 1] {
            rl(
                &mut con,
                &algo.cmd_with(&key, 10, "1h", &["COST", &cost.to_string()]),
            );
        }
    }
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "src:counted", 1, "1h", "COUNTDENIED"],
    );
    rl(
        &mut con,
        &argv!["RL.SLIDINGLOG", "src:counted", 1, "1h", "COUNTDENIED"],
    );
    let blobs: Vec<Vec<u8>> = aof_files(aof.dir())
        .iter()
        .flat_map(|f| aof_commands(f))
        .filter(|argv| argv.len() >= 3 && argv[0].eq_ignore_ascii_case(b"RL.APPLY"))
        .map(|argv| argv[2].clone())
        .collect();
    drop(con);
    drop(aof);
    assert!(!blobs.is_empty(), "no RL.APPLY found in the AOF");

    let mut server = Server::start();
    let mut con = server.conn();
    // Arity and types.
    assert_error(
        &mut con,
        &argv!["RL.APPLY"],
        "ERR wrong number of arguments",
    );
    q(&mut con, &argv!["SET", "str", "v"]);
    let e = apply(&mut con, "str", &blobs[0]);
    assert!(
        matches!(e, Value::ServerError(_)),
        "RL.APPLY on a string: {e:?}"
    );
    assert_eq!(string(&q(&mut con, &argv!["GET", "str"])), "v");
    // Unverifiable blobs.
    let mut accepted = 0;
    let mut refused = 0;
    let mut junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0xff; 3],
        b"hello".to_vec(),
        vec![0; 64],
        vec![0xff; 64],
    ];
    for blob in &blobs {
        for cut in 0..blob.len() {
            junk.push(blob[..cut].to_vec());
        }
        for i in 0..blob.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = blob.clone();
                b[i] ^= x;
                junk.push(b);
            }
        }
        let mut longer = blob.clone();
        longer.extend_from_slice(&[0, 1, 2]);
        junk.push(longer);
    }
    for (n, blob) in junk.iter().enumerate() {
        let key = format!("junk:{n}");
        match apply(&mut con, &key, blob) {
            Value::ServerError(_) => {
                refused += 1;
                assert!(!exists(&mut con, &key), "a refused RL.APPLY created {key}");
            }
            _ => {
                accepted += 1;
                exercise(&mut con, &key, &format!("RL.APPLY of {blob:?}"));
            }
        }
        if n % 100 == 0 {
            server.assert_alive();
        }
    }
    eprintln!(
        "{} blobs, {} mutations: {refused} refused, {accepted} accepted",
        blobs.len(),
        junk.len()
    );
    server.assert_alive();
}

/// RL.ALL queues its changes as one `RL.APPLY key effect key effect`; that
/// entry rebuilds both limiters exactly, and a bad pair in it writes nothing.
#[test]
fn rl_all_propagates_one_apply_of_pairs() {
    let aof = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = aof.conn();
    let keys = ["a:{all}", "b:{all}", "c:{all}"];
    let call = argv![
        "RL.ALL",
        3,
        keys[0],
        keys[1],
        keys[2],
        "TOKENBUCKET",
        10,
        1,
        "1h",
        "WINDOW",
        10,
        "1h",
        "SLIDINGLOG",
        10,
        "1h",
        "COST",
        2
    ];
    q(&mut con, &call);
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut con, k)).collect();
    let applies: Vec<Vec<Vec<u8>>> = aof_files(aof.dir())
        .iter()
        .flat_map(|f| aof_commands(f))
        .filter(|argv| argv[0].eq_ignore_ascii_case(b"RL.APPLY"))
        .collect();
    drop(con);
    drop(aof);
    assert_eq!(applies.len(), 1, "one entry for the call: {applies:?}");
    let entry = &applies[0];
    let named: Vec<&[u8]> = entry[1..].iter().step_by(2).map(|k| &k[..]).collect();
    assert_eq!(named, keys.map(str::as_bytes), "keys in order");

    let mut server = Server::start();
    let mut con = server.conn();
    let mut replay = redis::cmd("RL.APPLY");
    for arg in &entry[1..] {
        replay.arg(&arg[..]);
    }
    assert_eq!(raw_cmd(&mut con, &replay), Value::Okay);
    let replayed: Vec<String> = keys.iter().map(|k| digest(&mut con, k)).collect();
    assert_eq!(replayed, digests, "the entry rebuilds every limiter");

    q(&mut con, &argv!["FLUSHALL"]);
    let mut broken = redis::cmd("RL.APPLY");
    broken
        .arg(&entry[1][..])
        .arg(&entry[2][..])
        .arg(&entry[3][..])
        .arg("garbage");
    let e = error_of(&raw_cmd(&mut con, &broken)).expect("a bad pair is refused");
    assert!(e.contains("payload is invalid"), "{e}");
    for key in keys {
        assert_eq!(
            int(&q(&mut con, &argv!["EXISTS", key])),
            0,
            "{key} written by a refused RL.APPLY"
        );
    }
    let mut odd = redis::cmd("RL.APPLY");
    odd.arg(&entry[1][..]).arg(&entry[2][..]).arg(&entry[3][..]);
    let e = error_of(&raw_cmd(&mut con, &odd)).expect("a key without an effect is refused");
    assert!(e.contains("wrong number of arguments"), "{e}");
    server.assert_alive();
}
