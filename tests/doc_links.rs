//! Every internal link in the repository's Markdown resolves: a relative link
//! names a file or directory that exists, and a `#anchor` (in the same page or
//! another) names a heading there, as GitHub makes anchors of headings.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files of the repository (not build output or dependencies).
fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.')
                && !["target", "node_modules", "venv", ".venv"].contains(&name.as_str())
            {
                pages(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The page's lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (but `-`
/// and `_`), spaces to `-`; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // [text](target) in a heading counts as its text.
        let mut plain = String::new();
        let mut rest = heading.trim();
        while let Some(open) = rest.find('[') {
            plain.push_str(&rest[..open]);
            match rest[open..]
                .find("](")
                .and_then(|c| rest[open + c..].find(')').map(|e| (c, e)))
            {
                Some((close, end)) => {
                    plain.push_str(&rest[open + 1..open + close]);
                    rest = &rest[open + close + end + 1..];
                }
                None => {
                    plain.push('[');
                    rest = &rest[open + 1..];
                }
            }
        }
        plain.push_str(rest);
        let slug: String = plain
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// The targets of `[text](target)` links outside code.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        // Inline code spans hold examples, not links.
        let line: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push(target.to_string());
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_internal_link_resolves() {
    let mut all = Vec::new();
    pages(&root(), &mut all);
    assert!(
        all.iter().any(|p| p.ends_with("docs/reference.md")),
        "{all:?}"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &all {
        let text = fs::read_to_string(page).unwrap();
        for target in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(path)
            };
            let shown = page.strip_prefix(root()).unwrap().display();
            if !file.exists() {
                broken.push(format!("{shown}: ({target}): no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let anchors = anchors(&fs::read_to_string(&file).unwrap_or_default());
                if !anchors.contains(anchor) {
                    broken.push(format!("{shown}: ({target}): no heading with that anchor"));
                }
            }
        }
    }
    assert!(checked > 40, "only {checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let page = "# Title\n## Stored policies: RL.POLICY.SET and RL.LIMIT\n## Which algorithm?\n```\n# not a heading\n```\n## Title\n";
    let got = anchors(page);
    for want in [
        "title",
        "stored-policies-rlpolicyset-and-rllimit",
        "which-algorithm",
        "title-1",
    ] {
        assert!(got.contains(want), "{want} in {got:?}");
    }
    assert!(!got.contains("not-a-heading"));
}
