//! The conventions of an official Valkey module: the version in the scheme
//! MAJOR*10000+MINOR*100+PATCH (`MODULE LIST`) with its release stage (INFO),
//! and a load refused, with a reason in the server log, on a server older than
//! Valkey 8.0 or one that is not Valkey.

mod common;

use common::*;
use std::process::Command;

fn cargo_version() -> (i64, i64, i64) {
    let parts: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    (parts[0], parts[1], parts[2])
}

#[test]
fn module_list_and_info_report_the_version_and_release_stage() {
    let server = Server::start();
    let mut con = server.conn();
    let (major, minor, patch) = cargo_version();
    let modules = array(&q(&mut con, &argv!["MODULE", "LIST"])).to_vec();
    let ours = modules
        .iter()
        .map(|m| array(m).to_vec())
        .find(|m| {
            m.iter()
                .any(|v| matches!(v, redis::Value::BulkString(b) if b == b"ratelimit"))
        })
        .expect("ratelimit in MODULE LIST");
    let at = ours
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"ver"))
        .unwrap();
    assert_eq!(int(&ours[at + 1]), major * 10000 + minor * 100 + patch);
    let text = info(&mut con, "ratelimit");
    assert_eq!(
        field(&text, "ratelimit_version").as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        field(&text, "ratelimit_ver"),
        Some((major * 10000 + minor * 100 + patch).to_string())
    );
    let stage = field(&text, "ratelimit_release_stage").expect("release stage");
    let rc = stage
        .strip_prefix("rc")
        .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n >= 1));
    assert!(stage == "dev" || stage == "ga" || rc, "{stage}");
    // A released version has its CHANGELOG entry.
    if stage == "ga" {
        let changelog = include_str!("../CHANGELOG.md");
        assert!(
            changelog.contains(&format!("## [{}] - ", env!("CARGO_PKG_VERSION"))),
            "CHANGELOG.md has no entry for {}",
            env!("CARGO_PKG_VERSION")
        );
    }
}

/// Redis 7.0 (Debian's redis-server) stands in for a server older than
/// Valkey 8.0: the module must refuse it in the log, not crash it.
#[test]
fn a_server_that_is_not_valkey_8_or_newer_is_refused_with_a_reason() {
    needs_own_server("starts another server");
    let redis = std::env::var("RL_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let dir = TempDir::new("valkey-rl-old");
    let log_path = dir.path.join("server.log");
    let child = Command::new(&redis)
        // No TCP port: a socket in its own directory.
        .args(["--port", "0", "--save", "", "--appendonly", "no"])
        .arg("--unixsocket")
        .arg(dir.path.join("redis.sock"))
        .arg("--logfile")
        .arg(&log_path)
        .arg("--loadmodule")
        .arg(module_path())
        .current_dir(&dir.path)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("skipped: no {redis} ({e}); scripts/setup.sh installs it");
            return;
        }
    };
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{redis} still runs with the module:\n{}",
                tail(&log_path, 20)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let log = tail(&log_path, 50);
    assert!(!status.success(), "the server ran with the module:\n{log}");
    assert!(
        log.contains(&format!(
            "ratelimit {}: this is Redis 7.",
            env!("CARGO_PKG_VERSION")
        )) && log.contains("the module supports Valkey 8.0 and newer; not loading"),
        "no reason in the log:\n{log}"
    );
    assert!(!log.contains("crashed"), "{log}");
}
