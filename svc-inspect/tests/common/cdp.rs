//! A minimal Chrome DevTools Protocol driver over `--remote-debugging-pipe`, so a test can
//! keep one page open, change the fleet, and ask the same page (same `window`) what it
//! shows now. Chromium reads commands on fd 3 and writes answers on fd 4, each message
//! JSON ended by a NUL byte; a shell maps our stdin/stdout pipes onto those descriptors.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Bound on one protocol call: a wedged browser fails the test instead of hanging it.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    answers: mpsc::UnboundedReceiver<Value>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

/// One open tab (a flattened CDP session).
#[derive(Debug, Clone)]
pub struct Tab {
    session: String,
}

impl Browser {
    /// Headless Chromium with the suites' usual flags and a throwaway profile.
    pub async fn launch(bin: &Path) -> Self {
        let profile = tempfile::tempdir().expect("a chromium profile dir");
        let base = bigfleet_testkit::tools::chromium(bin, profile.path());
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"exec "$@" 3<&0 4>&1 </dev/null >/dev/null"#)
            .arg("sh")
            .arg(base.get_program())
            .args(base.get_args())
            .arg("--remote-debugging-pipe")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("chromium starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let (tx, answers) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut pending = Vec::new();
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = match stdout.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                pending.extend_from_slice(&buf[..n]);
                while let Some(end) = pending.iter().position(|b| *b == 0) {
                    let msg: Vec<u8> = pending.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice::<Value>(&msg[..msg.len() - 1])
                        && tx.send(v).is_err()
                    {
                        return;
                    }
                }
            }
        });
        Self {
            child,
            stdin,
            answers,
            next_id: 0,
            _profile: profile,
        }
    }

    /// Sends one command and waits for its answer (events in between are skipped).
    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.stdin
            .write_all(&bytes)
            .await
            .expect("write to chromium");
        self.stdin.flush().await.unwrap();
        let answers = &mut self.answers;
        let wait = async move {
            loop {
                let v = answers.recv().await.expect("chromium closed its pipe");
                if v.get("id").and_then(Value::as_u64) == Some(id) {
                    return v;
                }
            }
        };
        let v = tokio::time::timeout(CALL_TIMEOUT, wait)
            .await
            .unwrap_or_else(|_| panic!("chromium did not answer {method}"));
        if let Some(e) = v.get("error") {
            panic!("{method} failed: {e}");
        }
        v["result"].clone()
    }

    /// Opens `url` in a new tab.
    pub async fn open(&mut self, url: &str) -> Tab {
        let target = self
            .call(None, "Target.createTarget", json!({ "url": url }))
            .await;
        let target_id = target["targetId"].as_str().expect("a target id").to_owned();
        let attached = self
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target_id, "flatten": true }),
            )
            .await;
        Tab {
            session: attached["sessionId"]
                .as_str()
                .expect("a session id")
                .to_owned(),
        }
    }

    /// Evaluates `expr` in the tab and returns its value (promises awaited).
    pub async fn eval(&mut self, tab: &Tab, expr: &str) -> Value {
        let r = self
            .call(
                Some(&tab.session),
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Asks the browser to exit (no answer awaited: it may exit first), then reaps it.
    pub async fn close(mut self) {
        let mut bytes = serde_json::to_vec(&json!({ "id": 0, "method": "Browser.close" })).unwrap();
        bytes.push(0);
        let _ = self.stdin.write_all(&bytes).await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
