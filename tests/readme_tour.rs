//! The README's ten-minute tour, run as written on a fresh server: every
//! command of its valkey-cli sessions in order, and the replies it shows
//! checked (allowed, limit and remaining of each limiter reply, and whole
//! one-line replies; the times depend on the clock and are not compared).

mod common;

use common::*;
use redis::Value;

const PROMPT: &str = "127.0.0.1:6379> ";

/// A command's words and the replies shown: (top-level index, value).
type Step = (Vec<String>, Vec<(usize, String)>);

/// The tour's steps in order.
fn tour() -> Vec<Step> {
    let readme = include_str!("../README.md");
    let start = readme.find("## A ten-minute tour").expect("the tour");
    let tour = &readme[start..];
    let tour = &tour[..tour[3..].find("\n## ").map_or(tour.len(), |i| i + 3)];
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    for line in tour.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(command) = line.strip_prefix(PROMPT) {
            steps.push((
                // "   # ..." after a command is a comment.
                command
                    .split(" #")
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .map(String::from)
                    .collect(),
                Vec::new(),
            ));
            continue;
        }
        let Some((_, shown)) = steps.last_mut() else {
            continue;
        };
        if line.starts_with(' ') {
            continue; // nested items (RL.ALL's limiters)
        }
        let text = line.split(" #").next().unwrap_or("").trim_end();
        // "N) value" at the top level (no indent), or a one-line reply.
        let (index, value) = match text.split_once(") ") {
            Some((n, value)) if n.parse::<usize>().is_ok() => (n.parse().unwrap(), value),
            _ => (0, text),
        };
        if !value.is_empty() && value != "..." && !value.starts_with(|c: char| c.is_ascii_digit()) {
            shown.push((index, value.to_string()));
        }
    }
    steps
}

fn shown_value(v: &Value) -> String {
    match v {
        Value::Int(n) => format!("(integer) {n}"),
        Value::Okay => "OK".into(),
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => format!("\"{}\"", String::from_utf8_lossy(b)),
        other => format!("{other:?}"),
    }
}

#[test]
fn the_readme_tour_answers_as_shown() {
    let server = Server::start();
    let mut con = server.conn();
    let steps = tour();
    assert!(steps.len() >= 15, "the tour has {} commands", steps.len());
    let mut lease_ids: Vec<(String, String)> = Vec::new();
    let mut checked = 0;
    for (words, shown) in steps {
        // A lease id shown earlier stands for the one the server gave.
        let words: Vec<String> = words
            .iter()
            .map(|w| {
                lease_ids
                    .iter()
                    .find(|(shown, _)| shown == w)
                    .map_or(w.clone(), |(_, real)| real.clone())
            })
            .collect();
        let reply = q(&mut con, &words);
        for (index, value) in &shown {
            let got = match (&reply, index) {
                (Value::Array(items), 1..) => items.get(index - 1).map(shown_value),
                (single, 0) => Some(shown_value(single)),
                _ => None,
            };
            let got = got.unwrap_or_else(|| panic!("{words:?}: no item {index} in {reply:?}"));
            let quoted = value.trim_matches('"');
            if value.starts_with('"')
                && quoted.len() == 16
                && quoted.bytes().all(|b| b.is_ascii_hexdigit())
            {
                // A lease id: remember it, compare its form.
                assert_eq!(got.len(), 18, "{words:?}: {got}");
                lease_ids.push((value.trim_matches('"').into(), got.trim_matches('"').into()));
                continue;
            }
            // allowed, limit, remaining (items 1 to 3) and one-line replies;
            // later items are times.
            if *index <= 3 {
                assert_eq!(
                    &got, value,
                    "{words:?} item {index}: the README shows {value}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} values checked");
}
