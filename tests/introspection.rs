//! ACL category, command metadata, MODULE LIST, INFO.

mod common;

use common::*;
use redis::Value;

const COMMANDS: [&str; 3] = ["RL.TOKENBUCKET", "RL.WINDOW", "RL.SLIDINGLOG"];

#[test]
fn module_list_shows_ratelimit() {
    let server = Server::start();
    let mut con = server.conn();
    let v = q(&mut con, &argv!["MODULE", "LIST"]);
    let names: Vec<String> = array(&v)
        .iter()
        .filter_map(|m| {
            let fields = array(m);
            fields
                .iter()
                .position(|f| {
                    matches!(f, Value::BulkString(_) | Value::SimpleString(_))
                        && string(f) == "name"
                })
                .map(|i| string(&fields[i + 1]))
        })
        .collect();
    // Valkey 9.1 lists its built-in `lua` module too.
    assert_eq!(
        names.iter().filter(|n| *n == "ratelimit").count(),
        1,
        "{v:?}"
    );
}

#[test]
fn acl_category_ratelimit() {
    let server = Server::start();
    let mut con = server.conn();
    q(
        &mut con,
        &argv![
            "ACL",
            "SETUSER",
            "app",
            "on",
            "nopass",
            "~*",
            "+@ratelimit",
            "+ping"
        ],
    );
    let mut app = server.conn_as("app", "whatever");
    assert_eq!(
        q(&mut app, &argv!["PING"]),
        Value::SimpleString("PONG".into())
    );
    rl(&mut app, &argv!["RL.TOKENBUCKET", "a", 5, 1, "1h"]);
    rl(&mut app, &argv!["RL.WINDOW", "b", 5, "1h"]);
    rl(&mut app, &argv!["RL.WINDOW", "c", 5, "1h", "SLIDING"]);
    rl(&mut app, &argv!["RL.SLIDINGLOG", "d", 5, "1h"]);
    for cmd in [
        argv!["RL.APPLY", "a", "x"],
        argv!["GET", "a"],
        argv!["SET", "a", "b"],
        argv!["DEL", "a"],
    ] {
        let e = q_err(&mut app, &cmd);
        assert!(
            e.starts_with("NOPERM"),
            "{cmd:?} for a +@ratelimit user: {e}"
        );
    }
    // The default user sees the keys app wrote.
    assert_eq!(int(&q(&mut con, &argv!["EXISTS", "a", "b", "c", "d"])), 4);

    // A user without the category cannot run them.
    q(
        &mut con,
        &argv!["ACL", "SETUSER", "other", "on", "nopass", "~*", "+@read", "+ping"],
    );
    let mut other = server.conn_as("other", "x");
    for cmd in COMMANDS {
        let e = q_err(&mut other, &argv![cmd, "k", 5, 1, "1h"]);
        assert!(
            e.starts_with("NOPERM"),
            "{cmd} for a user without @ratelimit: {e}"
        );
    }
    // Key patterns apply.
    q(
        &mut con,
        &argv![
            "ACL",
            "SETUSER",
            "scoped",
            "on",
            "nopass",
            "~rl:*",
            "+@ratelimit"
        ],
    );
    let mut scoped = server.conn_as("scoped", "x");
    rl(&mut scoped, &argv!["RL.WINDOW", "rl:1", 5, "1h"]);
    let e = q_err(&mut scoped, &argv!["RL.WINDOW", "other:1", 5, "1h"]);
    assert!(e.starts_with("NOPERM"), "{e}");
    assert!(!exists(&mut con, "other:1"));
}

fn flags_of(info: &Value) -> Vec<String> {
    array(&array(info)[2]).iter().map(string).collect()
}

#[test]
fn command_info_flags_and_keys() {
    let server = Server::start();
    let mut con = server.conn();
    for cmd in COMMANDS {
        let v = q(&mut con, &argv!["COMMAND", "INFO", cmd]);
        let info = &array(&v)[0];
        assert!(!matches!(info, Value::Nil), "COMMAND INFO {cmd}: unknown");
        let fields = array(info);
        assert_eq!(string(&fields[0]).to_lowercase(), cmd.to_lowercase());
        let flags = flags_of(info);
        for flag in ["write", "denyoom", "fast"] {
            assert!(
                flags.contains(&flag.to_string()),
                "{cmd} flags {flags:?} lack {flag}"
            );
        }
        assert_eq!(int(&fields[3]), 1, "{cmd}: first key");
        assert_eq!(int(&fields[4]), 1, "{cmd}: last key");
        assert_eq!(int(&fields[5]), 1, "{cmd}: step");
        let categories: Vec<String> = array(&fields[6]).iter().map(string).collect();
        assert!(
            categories.contains(&"@ratelimit".to_string()),
            "{cmd} categories {categories:?} lack @ratelimit"
        );
    }
    let v = q(&mut con, &argv!["COMMAND", "INFO", "RL.APPLY"]);
    let info = &array(&v)[0];
    assert!(!matches!(info, Value::Nil), "RL.APPLY is not registered");
    assert!(flags_of(info).contains(&"write".to_string()), "{info:?}");
    let categories: Vec<String> = array(&array(info)[6]).iter().map(string).collect();
    assert!(
        !categories.contains(&"@ratelimit".to_string()),
        "RL.APPLY must not be in @ratelimit: {categories:?}"
    );
}

#[test]
fn command_getkeys_and_docs() {
    let server = Server::start();
    let mut con = server.conn();
    for cmd in [
        argv!["RL.TOKENBUCKET", "k", 1, 1, 1],
        argv!["RL.WINDOW", "k", 1, 1],
        argv!["RL.WINDOW", "k", 1, 1, "SLIDING", "COST", 1],
        argv!["RL.SLIDINGLOG", "k", 1, 1, "DRYRUN"],
        argv!["RL.APPLY", "k", "blob"],
    ] {
        let mut getkeys = argv!["COMMAND", "GETKEYS"];
        getkeys.extend(cmd.iter().cloned());
        let v = q(&mut con, &getkeys);
        let keys: Vec<String> = array(&v).iter().map(string).collect();
        assert_eq!(keys, vec!["k"], "COMMAND GETKEYS {cmd:?}");
    }
    for cmd in COMMANDS {
        let v = q(&mut con, &argv!["COMMAND", "DOCS", cmd]);
        let top = array(&v);
        assert_eq!(top.len(), 2, "COMMAND DOCS {cmd}: {v:?}");
        let doc = array(&top[1]);
        let summary = doc
            .chunks(2)
            .find(|pair| string(&pair[0]) == "summary")
            .map(|pair| string(&pair[1]))
            .unwrap_or_else(|| panic!("COMMAND DOCS {cmd} has no summary: {v:?}"));
        assert!(!summary.trim().is_empty(), "{cmd}: empty summary");
    }
}

#[test]
fn info_sections_do_not_crash() {
    let mut server = Server::start();
    let mut con = server.conn();
    rl(&mut con, &argv!["RL.TOKENBUCKET", "a", 5, 1, "1h"]);
    rl(&mut con, &argv!["RL.SLIDINGLOG", "b", 5, "1h"]);
    for section in [
        "ratelimit",
        "modules",
        "everything",
        "all",
        "ratelimit_stats",
        "default",
    ] {
        let text = info(&mut con, section);
        eprintln!("INFO {section}: {} bytes", text.len());
    }
    let modules = info(&mut con, "modules");
    assert!(modules.contains("name=ratelimit"), "{modules}");
    let everything = info(&mut con, "everything");
    let sections: Vec<&str> = everything.lines().filter(|l| l.starts_with("# ")).collect();
    eprintln!("sections: {sections:?}");
    server.assert_alive();
}

#[test]
fn keyspace_reports_the_keys() {
    let server = Server::start();
    let mut con = server.conn();
    for algo in Algo::ALL {
        rl(&mut con, &algo.cmd(&format!("ks:{algo:?}"), 5, "1h"));
    }
    let text = info(&mut con, "keyspace");
    let db0 = field(&text, "db0").unwrap_or_else(|| panic!("{text}"));
    assert!(
        db0.starts_with(&format!("keys={0},expires={0}", Algo::ALL.len())),
        "every limiter key has an expiry: {db0}"
    );
}

/// Beyond the spec (which asks for @ratelimit only): core commands get the
/// categories their flags imply (write -> @write, fast -> @fast), so ACL
/// rules such as `+@write` or `-@slow` cover them. Module commands only get
/// what the module declares; this checks that RL.* declare @write and @fast
/// too, so a `+@write` user may run them.
#[test]
fn commands_are_also_in_write_and_fast_categories() {
    let server = Server::start();
    let mut con = server.conn();
    for cmd in COMMANDS {
        let v = q(&mut con, &argv!["COMMAND", "INFO", cmd]);
        let categories: Vec<String> = array(&array(&array(&v)[0])[6]).iter().map(string).collect();
        for cat in ["@write", "@fast"] {
            assert!(
                categories.contains(&cat.to_string()),
                "{cmd} categories {categories:?} lack {cat}"
            );
        }
    }
    q(
        &mut con,
        &argv!["ACL", "SETUSER", "writer", "on", "nopass", "~*", "+@write", "-@slow"],
    );
    let mut writer = server.conn_as("writer", "x");
    rl(&mut writer, &argv!["RL.SLIDINGLOG", "w", 5, "1h"]);
    q(
        &mut con,
        &argv!["ACL", "SETUSER", "fast", "on", "nopass", "~*", "+@fast"],
    );
    let mut fast = server.conn_as("fast", "x");
    rl(&mut fast, &argv!["RL.WINDOW", "f", 5, "1h"]);
}
