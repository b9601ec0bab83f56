//! Stamps the `bigfleet` binary with the git commit it was built from, for `--version`.
//!
//! Sets `BIGFLEET_GIT_SHA` (short SHA, or `unknown` when git or the repository is absent,
//! as in a source tarball; `BIGFLEET_GIT_SHA` in the build environment wins),
//! `BIGFLEET_GIT_DIRTY` (`dirty`, `clean` or `unknown`: whether tracked files differed from
//! HEAD when this script last ran) and `BIGFLEET_GIT_DESCRIBE` (both in one phrase).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs git without optional locks: a plain `git status` refreshes the index on disk, and
/// the index is a watched file, so the stamp would invalidate itself and the next cargo
/// command would rebuild the CLI once more.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .current_dir(env_dir())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_owned())
}

fn env_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()))
}

/// Reruns this script when HEAD moves, the branch it names moves, or the index changes
/// (a commit, `git add`), without rescanning the whole tree on every build.
///
/// Only files that exist are watched: cargo treats a watched path that is missing as
/// changed, so watching `packed-refs` in a repository without one (or a loose branch ref
/// that `git gc` has packed) rebuilt this package on every cargo command. When a ref
/// moves between the two places, the loose file appears or vanishes, which reruns this.
fn watch(git_dir: &Path, common_dir: &Path) {
    let mut paths = vec![
        git_dir.join("HEAD"),
        git_dir.join("index"),
        // The reflog grows on every commit, checkout and reset, wherever the ref lives.
        git_dir.join("logs").join("HEAD"),
        common_dir.join("packed-refs"),
    ];
    if let Some(head_ref) = git(&["rev-parse", "--symbolic-full-name", "HEAD"])
        && head_ref.starts_with("refs/")
    {
        paths.push(common_dir.join(head_ref));
    }
    for path in paths.iter().filter(|p| p.exists()) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}

fn absolute(p: String) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() {
        p
    } else {
        env_dir().join(p)
    }
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // Edits to this package's sources change the dirty flag too.
    println!("cargo::rerun-if-changed=src");
    // As in libs/telemetry's build script: image builds that copy the sources without
    // `.git` pass the commit in, and then nothing is known about the tree.
    println!("cargo::rerun-if-env-changed=BIGFLEET_GIT_SHA");
    let given = std::env::var("BIGFLEET_GIT_SHA")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()));
    let sha = given.clone().or_else(|| {
        git(&["rev-parse", "--short=12", "HEAD"])
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    let dirty = match &sha {
        None => "unknown",
        Some(_) if given.is_some() => "unknown",
        // Untracked files do not count: a stray scratch file is not a different build.
        Some(_) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(s) if s.is_empty() => "clean",
            Some(_) => "dirty",
            None => "unknown",
        },
    };
    if let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        watch(&absolute(dir), &absolute(common));
    }
    println!(
        "cargo::rustc-env=BIGFLEET_GIT_SHA={}",
        sha.as_deref().unwrap_or("unknown")
    );
    println!("cargo::rustc-env=BIGFLEET_GIT_DIRTY={dirty}");
    let describe = match (&sha, dirty) {
        (None, _) => "unknown".to_owned(),
        (Some(s), "dirty") => format!("{s}, dirty tree"),
        (Some(s), _) => s.clone(),
    };
    println!("cargo::rustc-env=BIGFLEET_GIT_DESCRIBE={describe}");
}
