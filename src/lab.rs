//! `bigfleet lab kill|restart <child>` and `bigfleet lab provider-lists <answer>`: failure
//! on demand in a running `bigfleet up` (issue 23). The request travels as a file in `<run-dir>/control/` (the run directory comes
//! from the CLI context `up` wrote); `up`'s supervision loop carries it out within a second
//! and answers in a `.response` file next to it. Files, not a socket: nothing listens, and
//! only someone who can write the run directory can ask.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bigfleet_fake_provider::ListFault;

use crate::cli::{LabCommand, ListAnswer};
use crate::error::CliError;

/// Where requests wait for `up`.
pub fn control_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("control")
}

/// A List answer as `bigfleet lab provider-lists` names it (`truncated:N` keeps N).
pub fn answer_name(fault: Option<ListFault>) -> String {
    match fault {
        None => "honest".to_owned(),
        Some(ListFault::Unavailable) => "down".to_owned(),
        Some(ListFault::Empty) => "empty".to_owned(),
        Some(ListFault::Truncated(keep)) => format!("truncated:{keep}"),
        Some(ListFault::Invalid) => "invalid".to_owned(),
    }
}

/// Lists one `provider-lists` request may script: as many as the provider's admin API takes.
const MAX_LISTS: u32 = 10_000;

/// A request `up` understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Kill(String),
    Restart(String),
    /// Shard `shard`'s fake provider answers its next `lists` Lists with `fault`; `None`:
    /// honest again.
    ProviderLists {
        shard: usize,
        fault: Option<ListFault>,
        lists: u32,
    },
}

impl Request {
    fn encode(&self) -> String {
        match self {
            Request::Kill(c) => format!("kill {c}\n"),
            Request::Restart(c) => format!("restart {c}\n"),
            Request::ProviderLists {
                shard,
                fault,
                lists,
            } => format!("provider-lists {shard} {} {lists}\n", answer_name(*fault)),
        }
    }

    /// Parses one request file's text.
    pub fn decode(text: &str) -> Option<Request> {
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            ["kill", child] => Some(Request::Kill((*child).to_owned())),
            ["restart", child] => Some(Request::Restart((*child).to_owned())),
            ["provider-lists", shard, answer, lists] => {
                let lists: u32 = lists.parse().ok().filter(|n| (1..=MAX_LISTS).contains(n))?;
                let fault = match *answer {
                    "honest" => None,
                    "down" => Some(ListFault::Unavailable),
                    "empty" => Some(ListFault::Empty),
                    "invalid" => Some(ListFault::Invalid),
                    other => Some(ListFault::Truncated(
                        other.strip_prefix("truncated:")?.parse().ok()?,
                    )),
                };
                Some(Request::ProviderLists {
                    shard: shard.parse().ok()?,
                    fault,
                    lists,
                })
            }
            _ => None,
        }
    }

    /// The provider admin API body that carries out a `ProviderLists` request: the queue
    /// is replaced, so a second request does not wait behind the first one's lies.
    pub fn list_faults_body(fault: Option<ListFault>, lists: u32) -> serde_json::Value {
        let faults: Vec<ListFault> = fault.map(|f| vec![f; lists as usize]).unwrap_or_default();
        serde_json::json!({ "clear": true, "faults": faults })
    }
}

fn err(msg: impl Into<String>) -> CliError {
    CliError::Output(std::io::Error::other(msg.into()))
}

/// The client side: writes the request, waits for `up`'s answer, returns it.
pub async fn run(cmd: &LabCommand, timeout: Duration) -> Result<String, CliError> {
    let path = crate::context::default_path(|k| std::env::var(k).ok())
        .ok_or_else(|| err("no CLI context: is `bigfleet up` running? (see BIGFLEET_CONTEXT)"))?;
    let ctx = crate::context::load(&path)?.ok_or_else(|| {
        err(format!(
            "no CLI context at {}: is `bigfleet up` running?",
            path.display()
        ))
    })?;
    let run_dir = ctx.written_by.map(|w| w.run_dir).ok_or_else(|| {
        err(format!(
            "the context {} was not written by `bigfleet up`",
            path.display()
        ))
    })?;
    let request = match cmd {
        LabCommand::Kill { child } => Request::Kill(child.clone()),
        LabCommand::Restart { child } => Request::Restart(child.clone()),
        LabCommand::ProviderLists {
            answer,
            lists,
            keep,
            shard,
        } => Request::ProviderLists {
            shard: *shard,
            fault: match answer {
                ListAnswer::Down => Some(ListFault::Unavailable),
                ListAnswer::Empty => Some(ListFault::Empty),
                ListAnswer::Truncated => Some(ListFault::Truncated(*keep as usize)),
                ListAnswer::Invalid => Some(ListFault::Invalid),
                ListAnswer::Honest => None,
            },
            lists: *lists,
        },
    };
    let dir = control_dir(&run_dir);
    std::fs::create_dir_all(&dir).map_err(|source| CliError::File {
        path: dir.clone(),
        source,
    })?;
    let id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let tmp = dir.join(format!("{id}.tmp"));
    let req = dir.join(format!("{id}.request"));
    let resp = dir.join(format!("{id}.response"));
    std::fs::write(&tmp, request.encode())
        .and_then(|()| std::fs::rename(&tmp, &req))
        .map_err(|source| CliError::File {
            path: req.clone(),
            source,
        })?;
    let within = timeout.max(Duration::from_secs(30));
    // The check owns its path: one borrowing it would leave this future Send for only
    // one lifetime (a known async-closure limitation), and callers spawn it.
    let answer_file = resp.clone();
    let read = async move || Ok::<_, Infallible>(std::fs::read_to_string(&answer_file).ok());
    let Ok(answer) = bigfleet_mesh::poll_until(within, Duration::from_millis(100), read).await;
    let Some(text) = answer else {
        let _ = std::fs::remove_file(&req);
        return Err(err(format!(
            "`bigfleet up` (run dir {}) did not answer in time; is it still running?",
            run_dir.display()
        )));
    };
    let _ = std::fs::remove_file(&resp);
    match text.strip_prefix("error: ") {
        Some(e) => Err(err(e.trim().to_owned())),
        None => Ok(text),
    }
}

/// The `up` side: the waiting requests, oldest first, each with where to answer.
pub fn pending(run_dir: &Path) -> Vec<(PathBuf, Option<Request>)> {
    let dir = control_dir(run_dir);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut reqs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "request"))
        .collect();
    reqs.sort();
    reqs.into_iter()
        .map(|p| {
            let r = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| Request::decode(&t));
            (p, r)
        })
        .collect()
}

/// Answers a request (`Ok` text, or `error: ...`) and removes it.
pub fn answer(request_path: &Path, result: Result<String, String>) {
    let text = match result {
        Ok(t) => t,
        Err(e) => format!("error: {e}\n"),
    };
    let resp = request_path.with_extension("response");
    let _ = std::fs::write(&resp, text);
    let _ = std::fs::remove_file(request_path);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let lists = |fault| Request::ProviderLists {
            shard: 2,
            fault,
            lists: 30,
        };
        for r in [
            Request::Kill("coordinator".into()),
            Request::Restart("shard-0-decide".into()),
            lists(None),
            lists(Some(ListFault::Unavailable)),
            lists(Some(ListFault::Empty)),
            lists(Some(ListFault::Truncated(7))),
            lists(Some(ListFault::Invalid)),
        ] {
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        for bad in [
            "",
            "kill",
            "kill ",
            "explode coordinator",
            "kill a b",
            "provider-lists 0 lying 5",
            "provider-lists 0 truncated 5",
            "provider-lists 0 empty 0",
            "provider-lists 0 empty 10001",
            "provider-lists -1 empty 5",
        ] {
            assert_eq!(Request::decode(bad), None, "{bad:?}");
        }
        assert_eq!(
            Request::list_faults_body(Some(ListFault::Truncated(3)), 2),
            serde_json::json!({"clear": true, "faults": [{"truncated": 3}, {"truncated": 3}]})
        );
        assert_eq!(
            Request::list_faults_body(None, 30),
            serde_json::json!({"clear": true, "faults": []})
        );
    }

    #[test]
    fn pending_requests_are_read_in_order_and_answered() {
        let dir = tempfile::tempdir().unwrap();
        let c = control_dir(dir.path());
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("2.request"), "restart x\n").unwrap();
        std::fs::write(c.join("1.request"), "kill y\n").unwrap();
        std::fs::write(c.join("3.tmp"), "kill z\n").unwrap();
        let p = pending(dir.path());
        assert_eq!(
            p.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
            vec![
                Some(Request::Kill("y".into())),
                Some(Request::Restart("x".into()))
            ]
        );
        answer(&p[0].0, Err("no child named \"y\"".into()));
        assert!(!c.join("1.request").exists());
        assert!(
            std::fs::read_to_string(c.join("1.response"))
                .unwrap()
                .starts_with("error: ")
        );
    }
}
