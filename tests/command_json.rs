//! src/commands/<command>.json, one file per command in the format of
//! valkey's command files and valkey-doc (as the official modules keep them),
//! are generated from what the loaded module tells `COMMAND DOCS` and
//! `COMMAND INFO`, so the two cannot disagree: this test fails when a file
//! differs from the server, or a command has no file, or a file no command.
//!
//! After changing a command's docs, arity, flags or categories (src/shell/
//! register.rs, docs.rs), rewrite the files with:
//!
//!   RL_UPDATE_COMMAND_JSON=1 cargo test --release --test command_json

mod common;

use common::json::{from_value, pairs, Json};
use common::*;
use std::fs;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/commands")
}

fn upper(items: &Json, drop: &[&str]) -> Json {
    Json::Arr(
        items
            .items()
            .iter()
            .map(|i| i.as_str().trim_start_matches('@').to_string())
            .filter(|s| !drop.contains(&s.as_str()))
            .map(|s| Json::Str(s.to_uppercase()))
            .collect(),
    )
}

/// One argument of COMMAND DOCS in the file format: `display_text` only when
/// it is not the name, flags as booleans, sub-arguments nested.
fn argument(arg: &Json) -> Json {
    let arg = pairs(arg);
    let name = arg.get("name").expect("argument name").clone();
    let mut out = vec![("name".to_string(), name.clone())];
    for (field, value) in match &arg {
        Json::Obj(members) => members.clone(),
        _ => unreachable!(),
    } {
        match field.as_str() {
            "name" => {}
            "display_text" if value == name => {}
            "flags" => {
                for flag in value.items() {
                    out.push((flag.as_str().to_string(), Json::Bool(true)));
                }
            }
            "arguments" => out.push((
                field,
                Json::Arr(value.items().iter().map(argument).collect()),
            )),
            _ => out.push((field, value)),
        }
    }
    Json::Obj(out)
}

/// A key spec of COMMAND INFO in the file format.
fn key_spec(spec: &Json) -> Json {
    let spec = pairs(spec);
    let part = |name: &str, rename: &[(&str, &str)]| -> Json {
        let part = pairs(spec.get(name).expect("key spec part"));
        let kind = part.get("type").expect("type").as_str().to_string();
        let fields = match pairs(part.get("spec").expect("spec")) {
            Json::Obj(members) => members
                .into_iter()
                .map(|(n, v)| {
                    let n = rename
                        .iter()
                        .find(|(from, _)| *from == n)
                        .map_or(n.clone(), |(_, to)| to.to_string());
                    (n, v)
                })
                .collect(),
            _ => unreachable!(),
        };
        Json::Obj(vec![(kind, Json::Obj(fields))])
    };
    let (Some(flags), true) = (spec.get("flags"), spec.get("begin_search").is_some()) else {
        panic!("key spec without flags or begin_search: {spec:?}");
    };
    Json::Obj(vec![
        ("flags".into(), upper(flags, &[])),
        (
            "begin_search".into(),
            part("begin_search", &[("index", "pos")]),
        ),
        (
            "find_keys".into(),
            part("find_keys", &[("keystep", "step")]),
        ),
    ])
}

/// The file for `command`, from the server.
fn generate(con: &mut redis::Connection, command: &str) -> String {
    let docs = from_value(&q(con, &argv!["COMMAND", "DOCS", command]));
    let docs = pairs(&docs.items()[1]);
    let info = from_value(&q(con, &argv!["COMMAND", "INFO", command]));
    let info = info.items()[0].items();
    let text = |name: &str| {
        docs.get(name)
            .unwrap_or_else(|| panic!("{command}: no {name}"))
            .clone()
    };
    let mut body = vec![
        ("summary".to_string(), text("summary")),
        ("complexity".to_string(), text("complexity")),
        // COMMAND DOCS puts every module command in group "module"; the
        // files name the module, as valkey-bloom's name "bloom".
        ("group".to_string(), Json::str("ratelimit")),
        ("module_since".to_string(), text("since")),
        ("arity".to_string(), info[1].clone()),
        // "module" and "movablekeys" are the server's, derived.
        (
            "command_flags".to_string(),
            upper(&info[2], &["module", "movablekeys"]),
        ),
        ("acl_categories".to_string(), upper(&info[6], &[])),
    ];
    let tips = upper(&info[7], &[]);
    if !tips.items().is_empty() {
        body.push(("command_tips".to_string(), tips));
    }
    let specs = info[8].items();
    if !specs.is_empty() {
        body.push((
            "key_specs".to_string(),
            Json::Arr(specs.iter().map(key_spec).collect()),
        ));
    }
    if let Some(args) = docs.get("arguments") {
        body.push((
            "arguments".to_string(),
            Json::Arr(args.items().iter().map(argument).collect()),
        ));
    }
    Json::Obj(vec![(command.to_uppercase(), Json::Obj(body))]).pretty()
}

#[test]
fn command_files_match_command_docs() {
    let server = Server::start();
    let mut con = server.conn();
    let listed = from_value(&q(
        &mut con,
        &argv!["COMMAND", "LIST", "FILTERBY", "MODULE", "ratelimit"],
    ));
    let mut commands: Vec<String> = listed
        .items()
        .iter()
        .map(|c| c.as_str().to_lowercase())
        .collect();
    commands.sort();
    assert!(commands.len() >= 19, "{commands:?}");
    let update = std::env::var_os("RL_UPDATE_COMMAND_JSON").is_some();
    if update {
        fs::create_dir_all(dir()).unwrap();
    }
    let mut problems = Vec::new();
    for command in &commands {
        let path = dir().join(format!("{command}.json"));
        let wanted = generate(&mut con, command);
        if update {
            fs::write(&path, &wanted).unwrap();
            continue;
        }
        match fs::read_to_string(&path) {
            Ok(found) if found == wanted => {}
            Ok(found) => {
                let line = found
                    .lines()
                    .zip(wanted.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or(found.lines().count().min(wanted.lines().count()));
                problems.push(format!(
                    "{}: differs from COMMAND DOCS/INFO at line {}:\n  file:   {}\n  server: {}",
                    path.display(),
                    line + 1,
                    found.lines().nth(line).unwrap_or("<end>"),
                    wanted.lines().nth(line).unwrap_or("<end>")
                ));
            }
            Err(_) => problems.push(format!("{}: missing", path.display())),
        }
    }
    for entry in fs::read_dir(dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(command) = name.strip_suffix(".json") {
            if !commands.iter().any(|c| c == command) {
                problems.push(format!("src/commands/{name}: no such command"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n(regenerate: RL_UPDATE_COMMAND_JSON=1 cargo test --release --test command_json)",
        problems.join("\n")
    );
}
