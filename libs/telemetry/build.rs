//! Bakes the git commit into `bigfleet_build_info{git_sha}` as `BIGFLEET_GIT_SHA`.
//!
//! Never fails the build: without git or outside a work tree (a source tarball, a vendored
//! copy) the SHA is "unknown". `BIGFLEET_GIT_SHA` set in the build environment wins (image
//! builds that copy the sources without `.git` pass it in).

use std::process::Command;

fn main() {
    // Deliberately not re-run when HEAD moves: every crate depends on this one, and a
    // rebuild of the whole workspace after each local commit costs more than a development
    // build's SHA being that of the last time this crate compiled. Fresh builds (CI, images,
    // releases) are exact; `BIGFLEET_GIT_SHA=$(git rev-parse --short=12 HEAD)` forces it.
    println!("cargo:rerun-if-env-changed=BIGFLEET_GIT_SHA");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src");
    let sha = std::env::var("BIGFLEET_GIT_SHA")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(git_sha)
        .map(|s| clean(&s))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BIGFLEET_GIT_SHA={sha}");
}

fn git_sha() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A label value that needs no escaping: at most 40 of `[0-9A-Za-z._-]`.
fn clean(s: &str) -> String {
    s.trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(40)
        .collect()
}
