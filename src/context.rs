//! Where the CLI connects when no flag or environment variable says: the context file
//! `bigfleet up` writes (like a kubeconfig), so `bigfleet shards` just works against the mesh
//! running on this machine (issue 23).
//!
//! Location: `$BIGFLEET_CONTEXT` if set, else `$XDG_CONFIG_HOME/bigfleet/context.json`, else
//! `~/.config/bigfleet/context.json`. Precedence for each setting: flag, then environment
//! variable (clap reads both), then the context file, then the built-in default.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The environment variable naming another context file.
pub const CONTEXT_ENV: &str = "BIGFLEET_CONTEXT";

/// What a context names: where the coordinator and svc-inspect answer, and as whom to call
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CliContext {
    /// Coordinator URI, e.g. `http://127.0.0.1:41523`.
    pub coordinator: String,
    /// svc-inspect gRPC URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inspect: Option<String>,
    /// Client certificate, key and CA for an mTLS mesh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ContextTls>,
    /// Who wrote it (`bigfleet up`'s pid and run directory), for humans and for cleanup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<Writer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub pid: u32,
    pub run_dir: PathBuf,
}

/// Why a context file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("context file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("context file {path} is not a bigfleet context: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The context file's path from the environment (see the module docs); `None` when no home
/// directory is known and no variable says.
pub fn default_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(p) = env(CONTEXT_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let config = env("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".config")))?;
    Some(config.join("bigfleet").join("context.json"))
}

/// Reads the context at `path`; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<CliContext>, ContextError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ContextError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| ContextError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// Writes `ctx` to `path` atomically (parent directories created).
pub fn save(path: &Path, ctx: &CliContext) -> Result<(), ContextError> {
    let io = |source| ContextError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let json = serde_json::to_vec_pretty(ctx).map_err(|source| ContextError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, json).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Removes the context at `path` if `pid` wrote it (a later `up` may have replaced it).
pub fn remove_if_written_by(path: &Path, pid: u32) {
    if let Ok(Some(ctx)) = load(path)
        && ctx.written_by.as_ref().is_some_and(|w| w.pid == pid)
    {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_path_follows_the_variable_then_xdg_then_home() {
        assert_eq!(
            default_path(env(&[("BIGFLEET_CONTEXT", "/x/c.json"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/c.json"))
        );
        assert_eq!(
            default_path(env(&[("XDG_CONFIG_HOME", "/cfg"), ("HOME", "/h")])),
            Some(PathBuf::from("/cfg/bigfleet/context.json"))
        );
        assert_eq!(
            default_path(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.config/bigfleet/context.json"))
        );
        assert_eq!(default_path(env(&[])), None);
    }

    #[test]
    fn round_trip_and_cleanup_by_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/context.json");
        assert!(load(&path).unwrap().is_none());
        let ctx = CliContext {
            coordinator: "http://127.0.0.1:1".into(),
            inspect: Some("http://127.0.0.1:2".into()),
            tls: None,
            written_by: Some(Writer {
                pid: 42,
                run_dir: "/run".into(),
            }),
        };
        save(&path, &ctx).unwrap();
        assert_eq!(load(&path).unwrap(), Some(ctx));
        remove_if_written_by(&path, 7);
        assert!(path.exists(), "another process's context stays");
        remove_if_written_by(&path, 42);
        assert!(!path.exists());
    }

    #[test]
    fn a_broken_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("context.json");
        std::fs::write(&path, b"{nope").unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.to_string().contains("context.json"), "{err}");
    }
}
