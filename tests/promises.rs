//! What the docs promise, checked against the behaviour: each test reads the
//! sentence or table row it keeps from README.md and docs/*.md, so a change to
//! either side that breaks the promise fails here (issue 20, part 4).

mod common;

use common::json::{from_value, pairs, Json};
use common::*;
use redis::Value;
use std::fs;
use std::path::Path;

/// README.md and every page under docs/, joined.
fn docs() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut text = fs::read_to_string(root.join("README.md")).expect("README.md");
    if let Ok(entries) = fs::read_dir(root.join("docs")) {
        let mut pages: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        pages.sort();
        for page in pages
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
        {
            text.push('\n');
            text.push_str(&fs::read_to_string(page).unwrap());
        }
    }
    text
}

/// Every number written after `before` in the docs (a digit or a word up to twelve).
fn numbers_after(text: &str, before: &str) -> Vec<u64> {
    const WORDS: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    text.match_indices(before)
        .filter_map(|(at, _)| {
            let word: String = text[at + before.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == ',')
                .filter(|c| *c != ',')
                .collect();
            word.parse()
                .ok()
                .or_else(|| WORDS.iter().position(|w| *w == word).map(|n| n as u64))
        })
        .collect()
}

/// The top-level arguments of `COMMAND DOCS command`, as objects.
fn doc_arguments(con: &mut redis::Connection, command: &str) -> Vec<Json> {
    let docs = from_value(&q(con, &argv!["COMMAND", "DOCS", command]));
    let docs = pairs(&docs.items()[1]);
    docs.get("arguments")
        .map(|a| a.items().iter().map(pairs).collect())
        .unwrap_or_default()
}

#[test]
fn rl_all_names_policy_among_the_limiter_forms_as_the_error_table_does() {
    let server = Server::start();
    let mut con = server.conn();
    let e = q_err(
        &mut con,
        &argv!["RL.ALL", 3, "a", "b", "c", "WINDOW", 5, "1m", "COST", 1],
    );
    assert_eq!(
        e,
        "ERR limiter 2 must start with TOKENBUCKET, WINDOW, SLIDINGLOG, GCRA or POLICY, not 'COST' (numkeys is 3)"
    );
    assert!(
        docs().contains(&format!("`{e}`")),
        "the error table does not show RL.ALL's error as it is: {e}"
    );
    // COMMAND DOCS: one limiter is one of these forms; the docs say how many.
    let limiter = doc_arguments(&mut con, "rl.all")
        .into_iter()
        .find(|a| a.get("name") == Some(&Json::str("limiter")))
        .expect("RL.ALL's limiter argument");
    let forms: Vec<String> = limiter
        .get("arguments")
        .unwrap()
        .items()
        .iter()
        .map(|f| pairs(f).get("token").unwrap().as_str().to_string())
        .collect();
    assert_eq!(
        forms,
        ["TOKENBUCKET", "WINDOW", "SLIDINGLOG", "GCRA", "POLICY"]
    );
    let said = numbers_after(&docs(), "RL.ALL's ");
    assert!(!said.is_empty(), "the docs say how many forms RL.ALL takes");
    assert!(
        said.iter().all(|n| *n == forms.len() as u64),
        "the docs say RL.ALL takes {said:?} limiter forms; COMMAND DOCS lists {}",
        forms.len()
    );
}

/// `(expected A, B or C)` of an unknown option's error, as a list.
fn expected_list(error: &str) -> Vec<String> {
    let list = error
        .split_once("(expected ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no list of options in: {error}"));
    list.replace(" or ", ", ")
        .split(", ")
        .map(str::to_string)
        .collect()
}

#[test]
fn an_unknown_option_error_lists_the_options_the_command_takes_and_only_those() {
    let server = Server::start();
    let mut con = server.conn();
    q(
        &mut con,
        &argv!["RL.POLICY.SET", "api", "WINDOW", 100, "1m"],
    );
    let commands: &[(&str, Vec<String>)] = &[
        ("rl.tokenbucket", argv!["RL.TOKENBUCKET", "k1", 10, 1, "1s"]),
        ("rl.window", argv!["RL.WINDOW", "k2", 10, "1m"]),
        ("rl.slidinglog", argv!["RL.SLIDINGLOG", "k3", 10, "1m"]),
        ("rl.gcra", argv!["RL.GCRA", "k4", 10, 1, "1s"]),
        ("rl.limit", argv!["RL.LIMIT", "k5", "api"]),
        ("rl.all", argv!["RL.ALL", 1, "k6", "WINDOW", 5, "1m"]),
        ("rl.lease", argv!["RL.LEASE", "k7", 5, "1m"]),
    ];
    let value = |option: &str| match option {
        "COST" => Some("1"),
        "LOCKOUT" => Some("1s"),
        "BLOCK" => Some("1ms"),
        _ => None,
    };
    for (name, prefix) in commands {
        let mut cmd = prefix.clone();
        cmd.push("FOO".into());
        let listed = expected_list(&q_err(&mut con, &cmd));
        let documented: Vec<String> = doc_arguments(&mut con, name)
            .iter()
            .filter(|a| a.get("optional") == Some(&Json::str("")) || a.get("flags").is_some())
            .filter_map(|a| a.get("token").map(|t| t.as_str().to_string()))
            // TZ and ANCHOR belong to a calendar window's unit, right after
            // it (RL.WINDOW key limit month TZ zone ANCHOR day), not among
            // the options that follow a duration.
            .filter(|t| !(*name == "rl.window" && (t == "TZ" || t == "ANCHOR")))
            .collect();
        assert_eq!(
            listed, documented,
            "{name}: the error's list vs COMMAND DOCS"
        );
        for option in &listed {
            let mut cmd = prefix.clone();
            cmd.push(option.clone());
            cmd.extend(value(option).map(str::to_string));
            if let Err(e) = try_q(&mut con, &cmd) {
                panic!("{name} lists {option} but refuses it: {e}");
            }
            q(
                &mut con,
                &argv!["DEL", "k1", "k2", "k3", "k4", "k5", "k6", "k7"],
            );
        }
    }
}

#[test]
fn lease_memory_is_what_the_docs_say() {
    let server = Server::start();
    let mut con = server.conn();
    // "at most N bytes per lease": the figure the docs give.
    let text = docs();
    let per_lease: u64 = text
        .match_indices(" bytes per lease")
        .find_map(|(at, _)| {
            text[at.saturating_sub(20)..at]
                .rsplit_once("at most ")?
                .1
                .parse()
                .ok()
        })
        .expect("the docs say 'at most N bytes per lease'");
    for n in [1_100u64, 4_000] {
        let key = format!("jobs{n}");
        let mut pipe = redis::pipe();
        for _ in 0..n {
            pipe.cmd("RL.LEASE").arg(&key).arg(n).arg("1h").ignore();
        }
        pipe.query::<()>(&mut con).expect("leases");
        let peek = lease_remaining(&mut con, &key, n);
        assert_eq!(peek, 0, "{n} leases held");
        let usage = int(&q(&mut con, &argv!["MEMORY", "USAGE", &key])) as u64;
        // The key's own overhead (name, object, limiter) is under 200 bytes.
        assert!(
            usage <= per_lease * n + 200 && usage >= 24 * n,
            "{n} leases: MEMORY USAGE {usage}, {:.1} bytes a lease; the docs say at most {per_lease}",
            usage as f64 / n as f64
        );
    }
}

fn lease_remaining(con: &mut redis::Connection, key: &str, limit: u64) -> i64 {
    match q(con, &argv!["RL.LEASE", key, limit, "1h", "COST", 0]) {
        Value::Array(items) => int(&items[2]),
        Value::Map(pairs) => int(&pairs[2].1),
        other => panic!("RL.LEASE reply {other:?}"),
    }
}

/// CL.THROTTLE's reply as five integers.
fn cell(con: &mut redis::Connection, cmd: &[String]) -> Vec<i64> {
    array(&q(con, cmd)).iter().map(int).collect()
}

/// Replies of one MULTI/EXEC (one server time), each as integers.
fn cells_at_once(con: &mut redis::Connection, cmds: &[Vec<String>]) -> Vec<Vec<i64>> {
    exec(con, cmds)
        .iter()
        .map(|r| array(r).iter().map(int).collect())
        .collect()
}

fn migration_section() -> String {
    let text = docs();
    // The page's title or a section of that name, to the next such heading.
    let start = text
        .find("# Migrating from redis-cell\n")
        .expect("a heading 'Migrating from redis-cell'");
    let rest = &text[start + 2..];
    let end = [rest.find("\n# "), rest.find("\n## ")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Asserts the migration section mentions every one of `words`.
fn documented(words: &[&str]) {
    let section = migration_section();
    for w in words {
        assert!(
            section.contains(w),
            "'Migrating from redis-cell' does not mention {w:?}"
        );
    }
}

#[test]
fn redis_cell_versions_0_3_1_and_newer_round_up() {
    let server = Server::start();
    let mut con = server.conn();
    // T = 1.5 s: redis-cell 0.3.1 and newer answer 2, older ones 1.
    let reply = cell(&mut con, &argv!["CL.THROTTLE", "r", 0, 2, 3]);
    assert_eq!(reply, [0, 1, 0, -1, 2]);
    documented(&["0.3.1"]);
}

#[test]
fn redis_cell_differences_plus_and_minus_zero_are_not_numbers_here() {
    let server = Server::start();
    let mut con = server.conn();
    for (i, bad) in ["+15", "-0"].iter().enumerate() {
        for at in 2..5 {
            let mut cmd = argv!["CL.THROTTLE", "n", 15, 30, 60, 1];
            cmd[at] = bad.to_string();
            let e = q_err(&mut con, &cmd);
            assert!(
                e.starts_with("ERR ") && e.contains(" must be "),
                "{i} {cmd:?}: {e}"
            );
        }
    }
    assert!(!exists(&mut con, "n"));
    documented(&["`+15`", "`-0`"]);
}

#[test]
fn redis_cell_differences_remaining_is_never_negative() {
    let server = Server::start();
    let mut con = server.conn();
    // redis-cell answers 1 1 -1 0 0: limited, with remaining -1.
    let reply = cell(&mut con, &argv!["CL.THROTTLE", "k", 0, 666_666, 1, 0]);
    assert_eq!(reply, [0, 1, 1, -1, 0]);
    assert!(!exists(&mut con, "k"), "a peek writes nothing");
    documented(&[
        "`CL.THROTTLE k 0 666666 1 0`",
        "`1 1 -1 0 0`",
        "`0 1 1 -1 0`",
    ]);
}

#[test]
fn redis_cell_differences_long_durations_are_exact() {
    let server = Server::start();
    let mut con = server.conn();
    // Beyond about 194 days redis-cell's floating point can add a second:
    // here 3650 days are 315360000 s, to the second, both ways.
    let long = argv!["CL.THROTTLE", "long", 0, 1, "3650d"];
    let replies = cells_at_once(&mut con, &[long.clone(), long]);
    assert_eq!(replies[0], [0, 1, 0, -1, 315_360_000]);
    assert_eq!(replies[1], [1, 1, 0, 315_360_000, 315_360_000]);
    // Beyond about 104 days redis-cell's emission interval is off by a few
    // nanoseconds; here it is period / count exactly: 3650 d / 3 is
    // 105120000 s, which RL.PEEK shows in milliseconds.
    let replies = cells_at_once(
        &mut con,
        &[
            argv!["CL.THROTTLE", "third", 0, 3, "3650d"],
            argv!["RL.PEEK", "third"],
        ],
    );
    assert_eq!(replies[0][4], 105_120_000);
    assert_eq!(replies[1][4], 105_120_000_000, "RL.PEEK's reset_after_ms");
    documented(&["194 days", "104 days"]);
}

#[test]
fn redis_cell_differences_a_tolerance_beyond_2_63_ns_does_not_wrap() {
    let server = Server::start();
    let mut con = server.conn();
    // 100 * 3650 days is about 3.2e19 ns, beyond 2^63: redis-cell's numbers
    // wrap; here the burst is whole.
    let wide = argv!["CL.THROTTLE", "wide", 100, 1, "3650d"];
    let mut all = wide.clone();
    all.push("100".into());
    let replies = cells_at_once(&mut con, &[wide.clone(), all, wide]);
    assert_eq!(replies[0], [0, 101, 100, -1, 315_360_000]);
    assert_eq!(replies[1], [0, 101, 0, -1, 101 * 315_360_000]);
    assert_eq!(replies[2], [1, 101, 0, 315_360_000, 101 * 315_360_000]);
    // Beyond what fits in 2^94 ns, an error names the bound.
    let e = q_err(
        &mut con,
        &argv!["CL.THROTTLE", "wider", 100_000_000_000_000u64, 1, "3650d"],
    );
    assert!(e.starts_with("ERR ") && e.contains("2^94"), "{e}");
    documented(&["2^63"]);
}

#[test]
fn redis_cell_differences_a_key_of_another_type_is_wrongtype_not_a_crash() {
    let mut server = Server::start();
    let mut con = server.conn();
    q(&mut con, &argv!["SET", "s", "x"]);
    q(&mut con, &argv!["LPUSH", "l", "x"]);
    for key in ["s", "l"] {
        let e = q_err(&mut con, &argv!["CL.THROTTLE", key, 1, 1, 1]);
        assert!(e.starts_with("WRONGTYPE"), "{e}");
    }
    assert_eq!(string(&q(&mut con, &argv!["GET", "s"])), "x");
    server.assert_alive();
    documented(&["WRONGTYPE", "panics"]);
}
