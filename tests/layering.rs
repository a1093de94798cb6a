//! No file of `src/` depends, directly or through others, on a file that
//! depends on it (the layering is stated in `src/shell/mod.rs`). A circle
//! lets a change to one file break any file on it and hides which file is
//! the lower one; this test fails when one comes back and prints it.
//!
//! A file's dependencies are the files its paths name: `use super::x`,
//! `super::x::f()`, `crate::shell::x`, `crate::core::x`, `use super::{a, b}`
//! groups across lines, `self::` and paths starting at a child module (in
//! lib.rs and mod.rs files). A path resolves to the deepest file it reaches:
//! `super::Millis` in a core file is `core/mod.rs`. Comments, strings and
//! `#[cfg(test)]` items (the unit tests) are not read. No server is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path from the crate root: [] is lib.rs, ["shell", "ffi"] ffi.rs.
type ModPath = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(parts.is_empty() && stem == "lib") && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The source with comments, string and char literals blanked out.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if b[i] == b'r'
            && (rest.starts_with(b"r\"") || rest.starts_with(b"r#"))
            && !ident_before(b, i)
        {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\'') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path, // ::
    Punct(char),
}

fn tokens(code: &str) -> Vec<Token> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token::Ident(code[start..i].to_string()));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
        } else if b[i..].starts_with(b"::") {
            out.push(Token::Path);
            i += 2;
        } else {
            if !c.is_ascii_whitespace() {
                out.push(Token::Punct(c as char));
            }
            i += 1;
        }
    }
    out
}

/// The tokens without `#[cfg(test)]` items: the attribute, then the item up
/// to its `;` or through its balanced `{ ... }`.
fn without_test_items(tokens: Vec<Token>) -> Vec<Token> {
    let cfg_test = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i..].starts_with(&cfg_test) {
            i += cfg_test.len();
            let mut depth = 0;
            while i < tokens.len() {
                match tokens[i] {
                    Token::Punct('{') => depth += 1,
                    Token::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    Token::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(tokens[i].clone());
            i += 1;
        }
    }
    out
}

/// Reads the path starting at `tokens[i]` (an identifier), expanding
/// `{a, b::c, self}` groups; pushes each full path. Returns the index after.
fn read_path(
    tokens: &[Token],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(i) {
            Some(Token::Ident(name)) => {
                if name != "self" || path.is_empty() {
                    path.push(name.clone());
                }
                i += 1;
            }
            Some(Token::Punct('{')) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        Some(Token::Punct('}')) | None => return i + 1,
                        Some(Token::Punct(',')) => i += 1,
                        Some(Token::Ident(_)) => i = read_path(tokens, i, &path, out),
                        Some(_) => i += 1, // `*`, `as` renames' punctuation
                    }
                }
            }
            _ => break,
        }
        if tokens.get(i) == Some(&Token::Path) {
            i += 1;
        } else {
            break;
        }
    }
    out.push(path);
    i
}

/// The child modules a file declares (`mod x;`, `pub mod x;`).
fn declared_modules(tokens: &[Token]) -> BTreeSet<String> {
    tokens
        .windows(3)
        .filter_map(|w| match w {
            [Token::Ident(m), Token::Ident(name), Token::Punct(';')] if m == "mod" => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect()
}

/// The deepest file module that `path` (absolute) reaches.
fn resolve(path: &[String], files: &BTreeMap<ModPath, PathBuf>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| files.contains_key(prefix))
        .unwrap_or_default()
}

fn dependencies(
    module: &ModPath,
    text: &str,
    files: &BTreeMap<ModPath, PathBuf>,
) -> BTreeSet<ModPath> {
    let all = tokens(&code_only(text));
    let children = declared_modules(&all);
    let tokens = without_test_items(all);
    let mut paths = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let starts = match &tokens[i] {
            Token::Ident(name) => {
                let after_path = i > 0 && tokens[i - 1] == Token::Path;
                let is_root =
                    matches!(name.as_str(), "crate" | "super" | "self") || children.contains(name);
                !after_path && is_root && tokens.get(i + 1) == Some(&Token::Path)
            }
            _ => false,
        };
        if starts {
            i = read_path(&tokens, i, &[], &mut paths);
        } else {
            i += 1;
        }
    }
    let mut deps = BTreeSet::new();
    for path in paths {
        let mut absolute = module.clone();
        let mut rest = path.as_slice();
        match rest.first().map(String::as_str) {
            Some("crate") => {
                absolute.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            _ => {}
        }
        while rest.first().map(String::as_str) == Some("super") {
            absolute.pop();
            rest = &rest[1..];
        }
        absolute.extend(rest.iter().cloned());
        let target = resolve(&absolute, files);
        if &target != module {
            deps.insert(target);
        }
    }
    deps
}

fn name(module: &ModPath, files: &BTreeMap<ModPath, PathBuf>) -> String {
    files[module].display().to_string()
}

/// The knots of the graph: its strongly connected components of more than
/// one file (Tarjan's algorithm; the graph is a few dozen files).
fn knots(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct State<'g> {
        graph: &'g BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'g ModPath, usize>,
        low: BTreeMap<&'g ModPath, usize>,
        stack: Vec<&'g ModPath>,
        on_stack: BTreeSet<&'g ModPath>,
        knots: Vec<Vec<ModPath>>,
    }
    fn visit<'g>(node: &'g ModPath, s: &mut State<'g>) {
        let n = s.index.len();
        s.index.insert(node, n);
        s.low.insert(node, n);
        s.stack.push(node);
        s.on_stack.insert(node);
        for next in &s.graph[node] {
            if !s.index.contains_key(next) {
                visit(next, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut knot = Vec::new();
            while let Some(member) = s.stack.pop() {
                s.on_stack.remove(member);
                knot.push(member.clone());
                if member == node {
                    break;
                }
            }
            if knot.len() > 1 {
                knot.sort();
                s.knots.push(knot);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        knots: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(node, &mut state);
        }
    }
    state.knots
}

/// A shortest circle from `start` back to it (breadth-first).
fn shortest_circle(start: &ModPath, graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<ModPath> {
    let mut came_from: BTreeMap<ModPath, ModPath> = BTreeMap::new();
    let mut frontier = std::collections::VecDeque::from([start.clone()]);
    while let Some(node) = frontier.pop_front() {
        for next in &graph[&node] {
            if next == start {
                let mut circle = vec![start.clone()];
                let mut at = node.clone();
                while &at != start {
                    circle.insert(1, at.clone());
                    at = came_from[&at].clone();
                }
                circle.push(start.clone());
                return circle;
            }
            if !came_from.contains_key(next) {
                came_from.insert(next.clone(), node.clone());
                frontier.push_back(next.clone());
            }
        }
    }
    Vec::new()
}

fn graph() -> (
    BTreeMap<ModPath, PathBuf>,
    BTreeMap<ModPath, BTreeSet<ModPath>>,
) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files: BTreeMap<ModPath, PathBuf> = paths
        .iter()
        .map(|p| {
            let shown = p.strip_prefix(&root).unwrap_or(p).to_path_buf();
            (module_path(&src, p), shown)
        })
        .collect();
    let graph = paths
        .iter()
        .map(|p| {
            let module = module_path(&src, p);
            let text = fs::read_to_string(p).expect("read a source file");
            let deps = dependencies(&module, &text, &files);
            (module, deps)
        })
        .collect();
    (files, graph)
}

#[test]
fn no_file_of_src_depends_on_itself_through_others() {
    let (files, graph) = graph();
    // The reader works: known edges are seen (a parser that finds nothing
    // would pass the check below for nothing).
    let edge = |from: &[&str], to: &[&str]| {
        let from: ModPath = from.iter().map(|s| s.to_string()).collect();
        let to: ModPath = to.iter().map(|s| s.to_string()).collect();
        graph.get(&from).is_some_and(|deps| deps.contains(&to))
    };
    assert!(edge(&["shell", "register"], &["shell", "ffi"]));
    assert!(edge(&["core", "policy"], &["core", "limiter"]));
    assert!(edge(&["shell", "ffi"], &["args"]));
    assert!(edge(&[], &["shell", "register"]));

    let mut circles = Vec::new();
    for knot in knots(&graph) {
        let members: Vec<String> = knot.iter().map(|m| name(m, &files)).collect();
        let circle: Vec<String> = shortest_circle(&knot[0], &graph)
            .iter()
            .map(|m| name(m, &files))
            .collect();
        circles.push(format!(
            "{} files depend on each other: {}\n  e.g. {}",
            knot.len(),
            members.join(", "),
            circle.join(" -> ")
        ));
    }
    assert!(
        circles.is_empty(),
        "files of src/ that depend on themselves through others:\n{}",
        circles.join("\n")
    );
}

/// The shell's files in the order its top doc comment lists them, bottom to
/// top, each with its layer's number (from "Bottom to top:" to the end of
/// the numbered list; a backticked name that is no file is not counted).
fn stated_layers(files: &BTreeMap<ModPath, PathBuf>) -> Vec<(usize, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("src/shell/mod.rs")).expect("read src/shell/mod.rs");
    let doc: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .skip_while(|l| !l.ends_with("Bottom to top:"))
        .skip(1)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let mut listed = Vec::new();
    let mut layer = 0;
    for line in doc {
        if let Some((number, _)) = line.split_once(". ") {
            if let Ok(n) = number.parse::<usize>() {
                layer = n;
            }
        }
        for (i, part) in line.split('`').enumerate() {
            let file: ModPath = vec!["shell".into(), part.into()];
            if i % 2 == 1 && files.contains_key(&file) {
                listed.push((layer, part.to_string()));
            }
        }
    }
    listed
}

#[test]
fn every_shell_file_uses_only_files_listed_below_it() {
    let (files, graph) = graph();
    let listed = stated_layers(&files);
    let position = |name: &str| listed.iter().position(|(_, n)| n == name);
    let mut wrong = Vec::new();
    for module in files.keys().filter(|m| m.len() == 2 && m[0] == "shell") {
        let count = listed.iter().filter(|(_, n)| *n == module[1]).count();
        if count != 1 {
            wrong.push(format!("{} is listed {count} times", name(module, &files)));
        }
    }
    for (module, deps) in &graph {
        let Some(at) = module
            .get(1)
            .filter(|_| module[0] == "shell")
            .and_then(|n| position(n))
        else {
            continue;
        };
        for dep in deps {
            let below = match dep.as_slice() {
                [shell, file] if shell == "shell" => position(file).is_some_and(|p| p < at),
                // Nothing below the shell uses it; lib.rs sits above it.
                [first, ..] => first != "shell",
                [] => false,
            };
            if !below {
                wrong.push(format!(
                    "{} (layer {}) uses {}, which is not listed below it",
                    name(module, &files),
                    listed[at].0,
                    name(dep, &files)
                ));
            }
        }
    }
    assert!(
        !listed.is_empty() && wrong.is_empty(),
        "the layering stated in src/shell/mod.rs does not hold:\n{}",
        wrong.join("\n")
    );
}
