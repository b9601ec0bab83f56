//! External tools the suites drive (headless Chromium, grpcurl): finding them through the
//! variables `scripts/test` exports, running them off the async runtime, and reading what
//! Chromium rendered.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The tool's path from `var`, or `None` (with a notice) so the test can skip; under `CI`
/// a missing tool is a failure, not a skip.
pub fn tool(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} is unset under CI: scripts/test must source .tools/env")
        }
        _ => {
            eprintln!("NOTICE: {var} is unset; skipping this test (source .tools/env to run it)");
            None
        }
    }
}

/// Runs a blocking command off the async runtime: (success, stdout, stderr).
pub async fn run(mut cmd: Command) -> (bool, String, String) {
    let shown = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the command's task")
        .unwrap_or_else(|e| panic!("{shown}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Headless Chromium with a throwaway profile and nothing that phones home.
pub fn chromium(bin: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The text a reader sees in the rendered DOM: tags, styles and the title dropped.
pub fn visible(dom: &str) -> String {
    let mut out = String::new();
    let mut hidden = false;
    for part in dom.split('<') {
        let (tag, rest) = part.split_once('>').unwrap_or(("", part));
        let lower = tag.to_lowercase();
        if lower.starts_with("style") || lower.starts_with("title") {
            hidden = true;
        } else if lower.starts_with("/style") || lower.starts_with("/title") {
            hidden = false;
        }
        if !hidden {
            out.push(' ');
            out.push_str(rest);
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Renders `url` in headless Chromium: its visible text, and a PNG screenshot at `shot`
/// (checked to be a real image, not an error page's few bytes).
pub async fn dump_and_shoot(bin: &Path, url: &str, shot: &Path) -> String {
    let profile = tempfile::tempdir().expect("a chromium profile dir");
    let mut dump = chromium(bin, profile.path());
    dump.arg("--dump-dom").arg(url);
    let (ok, dom, err) = run(dump).await;
    assert!(ok, "chromium --dump-dom {url} failed: {err}");

    let _ = std::fs::remove_file(shot);
    let mut cmd = chromium(bin, profile.path());
    cmd.arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1280,900")
        .arg(url);
    let (ok, _, err) = run(cmd).await;
    assert!(ok, "chromium --screenshot {url} failed: {err}");
    let png = std::fs::read(shot)
        .unwrap_or_else(|e| panic!("{}: {e}; chromium said: {err}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000,
        "{} is not a real screenshot",
        shot.display()
    );
    visible(&dom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_text_drops_tags_styles_and_title() {
        let dom = "<html><head><title>t</title><style>p{x:y}</style></head>\
                   <body><h1>Fleet</h1><p>3 shards</p></body></html>";
        assert_eq!(visible(dom), "Fleet 3 shards");
    }

    #[tokio::test]
    async fn run_reports_status_and_output() {
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo out; echo err >&2"]);
        assert_eq!(run(ok).await, (true, "out\n".into(), "err\n".into()));
        let mut fail = Command::new("sh");
        fail.args(["-c", "exit 3"]);
        assert!(!run(fail).await.0);
    }
}
