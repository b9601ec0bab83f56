//! `cargo metadata` for the dependency-rule tests (the workspace's architecture test and
//! decide core's static-stability test), resolved for the host only.

use std::path::Path;
use std::process::Command;

/// The host's target triple, from `rustc -vV` (the compiler cargo builds the test with).
pub fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("run {rustc} -vV: {e}"));
    assert!(out.status.success(), "{rustc} -vV failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_owned())
        .expect("rustc -vV prints a host line")
}

/// The JSON of `cargo metadata --offline` for the workspace of `manifest`, for the host
/// only. Without `--filter-platform`, `--offline` needs every package in the lock file for
/// *every* platform and fails on a machine whose cargo cache holds only what a host build
/// downloaded (issue 22); the rules are about what this host links anyway.
pub fn host_metadata(manifest: &Path) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(host_triple())
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
