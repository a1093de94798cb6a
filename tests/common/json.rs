//! A little JSON for the command files (src/commands/*.json): the tree
//! COMMAND DOCS and COMMAND INFO describe, printed as valkey's own command
//! files are (four-space indent, one member a line), so a file and the server
//! compare as text.

use redis::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Json {
    Str(String),
    Int(i64),
    Bool(bool),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn str(text: impl Into<String>) -> Json {
        Json::Str(text.into())
    }

    /// A member of an object.
    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Obj(members) => members.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }

    pub fn items(&self) -> &[Json] {
        match self {
            Json::Arr(items) => items,
            other => panic!("not an array: {other:?}"),
        }
    }

    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |n: usize| "    ".repeat(n);
        match self {
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Int(n) => out.push_str(&n.to_string()),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Arr(items) if items.is_empty() => out.push_str("[]"),
            Json::Obj(members) if members.is_empty() => out.push_str("{}"),
            Json::Arr(items) => {
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    out.push_str(&pad(depth + 1));
                    item.write(out, depth + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(depth));
                out.push(']');
            }
            Json::Obj(members) => {
                out.push_str("{\n");
                for (i, (name, value)) in members.iter().enumerate() {
                    out.push_str(&pad(depth + 1));
                    Json::Str(name.clone()).write(out, depth + 1);
                    out.push_str(": ");
                    value.write(out, depth + 1);
                    out.push_str(if i + 1 < members.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(depth));
                out.push('}');
            }
        }
    }
}

/// A RESP reply as JSON: a flat [name, value, ...] array of a map or a
/// RESP3 map becomes an object when `as_map` says so at that depth.
pub fn from_value(v: &Value) -> Json {
    match v {
        Value::BulkString(b) => Json::Str(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Json::Str(s.clone()),
        Value::Int(n) => Json::Int(*n),
        Value::Array(items) | Value::Set(items) => {
            Json::Arr(items.iter().map(from_value).collect())
        }
        Value::Map(pairs) => Json::Obj(
            pairs
                .iter()
                .map(|(k, v)| (from_value(k).as_str().to_string(), from_value(v)))
                .collect(),
        ),
        Value::Nil => Json::Str(String::new()),
        other => panic!("unexpected reply in COMMAND output: {other:?}"),
    }
}

/// A flat [name, value, name, value, ...] array as an object.
pub fn pairs(flat: &Json) -> Json {
    match flat {
        Json::Obj(_) => flat.clone(),
        Json::Arr(items) => Json::Obj(
            items
                .chunks(2)
                .map(|pair| (pair[0].as_str().to_string(), pair[1].clone()))
                .collect(),
        ),
        other => panic!("not a map: {other:?}"),
    }
}
