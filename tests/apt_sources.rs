//! scripts/apt-sources.sh, which setup.sh and valkey9.sh use to add an apt
//! source: an entry that is already there, in either format, is not added a
//! second time, and what it leaves behind is a list apt accepts (checked with
//! apt's own parser when apt-get is installed).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const SID_DEB822: &str = "Types: deb deb-src
URIs: http://deb.debian.org/debian/
Suites: sid
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

/// A fresh APT_ETC, removed when dropped.
struct Etc(PathBuf);

impl std::ops::Deref for Etc {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Etc {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh APT_ETC with these files under sources.list.d.
fn etc(name: &str, files: &[(&str, &str)]) -> Etc {
    let dir = std::env::temp_dir().join(format!("rl-apt-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("sources.list.d")).unwrap();
    for (file, text) in files {
        fs::write(dir.join("sources.list.d").join(file), text).unwrap();
    }
    Etc(dir)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/apt-sources.sh")
}

/// Runs `call` (a shell function call) with the script sourced; (ok, stderr).
fn run(dir: &Path, call: &str) -> (bool, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}'; {call}", script().display()))
        .env("APT_ETC", dir)
        .output()
        .expect("bash");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ensure_sid(dir: &Path) -> (bool, String) {
    run(
        dir,
        "apt_ensure_source deb-src http://deb.debian.org/debian sid main valkey-ratelimit-sid-src",
    )
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join("sources.list.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// apt's verdict on the lists (None without apt-get): Ok(the index targets'
/// descriptions) or Err(apt's error).
fn apt_parse(dir: &Path) -> Option<Result<String, String>> {
    let out = Command::new("apt-get")
        .arg("-o")
        .arg(format!("Dir::Etc={}", dir.display()))
        .args(["-o", "Dir::Etc::Parts=/nonexistent", "indextargets"])
        .args([
            "--format",
            "$(TARGET_OF) $(REPO_URI) $(RELEASE) $(COMPONENT)",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(if out.status.success() {
        Ok(text)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

fn assert_apt_accepts(dir: &Path, wanted: &str) {
    match apt_parse(dir) {
        None => eprintln!("apt-get not installed: apt's own check skipped"),
        Some(Err(e)) => panic!("apt refuses the lists in {}: {e}", dir.display()),
        Some(Ok(targets)) => assert!(
            targets.lines().any(|l| l.trim() == wanted),
            "apt lists no '{wanted}' in:\n{targets}"
        ),
    }
}

#[test]
fn a_deb822_entry_with_signed_by_is_not_added_again_and_our_old_line_goes() {
    // The state that made apt refuse every list: the user's deb822 entry and
    // the one-line file an older valkey9.sh wrote.
    let dir = etc(
        "deb822",
        &[
            ("debian.sources", SID_DEB822),
            (
                "valkey-ratelimit-sid-src.list",
                "deb-src http://deb.debian.org/debian sid main\n",
            ),
        ],
    );
    if let Some(Ok(_)) = apt_parse(&dir) {
        panic!("apt should refuse the conflicting lists this test starts from");
    }
    let (ok, said) = ensure_sid(&dir);
    assert!(ok, "{said}");
    assert_eq!(files(&dir), ["debian.sources"], "{said}");
    assert_apt_accepts(&dir, "deb-src http://deb.debian.org/debian/ sid main");
    // Twice is the same as once.
    let (ok, said) = ensure_sid(&dir);
    assert!(ok && said.is_empty(), "{said}");
    assert_eq!(files(&dir), ["debian.sources"]);
}

#[test]
fn a_one_line_entry_under_either_suite_name_is_not_added_again() {
    for line in [
        "deb-src http://deb.debian.org/debian/ unstable main\n",
        "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg arch=amd64] http://deb.debian.org/debian sid main non-free\n",
    ] {
        let dir = etc("oneline", &[("mine.list", line)]);
        let (ok, said) = ensure_sid(&dir);
        assert!(ok, "{said}");
        assert_eq!(files(&dir), ["mine.list"], "{line}: {said}");
    }
}

#[test]
fn a_new_entry_copies_the_signed_by_of_the_suites_other_entries() {
    let deb_only = SID_DEB822.replace("Types: deb deb-src", "Types: deb");
    let dir = etc("copy", &[("debian.sources", &deb_only)]);
    let (ok, said) = ensure_sid(&dir);
    assert!(ok, "{said}");
    assert_eq!(
        files(&dir),
        ["debian.sources", "valkey-ratelimit-sid-src.sources"]
    );
    let ours =
        fs::read_to_string(dir.join("sources.list.d/valkey-ratelimit-sid-src.sources")).unwrap();
    assert!(
        ours.contains("Types: deb-src\n")
            && ours.contains("Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"),
        "{ours}"
    );
    assert_apt_accepts(&dir, "deb-src http://deb.debian.org/debian/ sid main");
    let (ok, said) = ensure_sid(&dir);
    assert!(ok && said.is_empty(), "second run: {said}");
}

#[test]
fn disabled_or_commented_entries_do_not_count() {
    let disabled = format!("{SID_DEB822}Enabled: no\n");
    let dir = etc(
        "disabled",
        &[
            ("off.sources", &disabled),
            (
                "commented.list",
                "# deb-src http://deb.debian.org/debian sid main\n",
            ),
        ],
    );
    let (ok, said) = ensure_sid(&dir);
    assert!(ok, "{said}");
    let ours =
        fs::read_to_string(dir.join("sources.list.d/valkey-ratelimit-sid-src.sources")).unwrap();
    assert!(
        !ours.contains("Signed-By"),
        "a disabled entry's key is not copied: {ours}"
    );
    assert_apt_accepts(&dir, "deb-src http://deb.debian.org/debian/ sid main");
}

#[test]
fn setup_finds_backports_in_a_deb822_list_of_several_suites() {
    let dir = etc(
        "backports",
        &[(
            "debian.sources",
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )],
    );
    let call = "apt_has_source deb http://deb.debian.org/debian bookworm-backports main";
    assert!(run(&dir, call).0);
    assert!(!run(&dir, &call.replace("backports", "proposed-updates")).0);
}
