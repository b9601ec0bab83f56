//! Unix sockets: the directory they live in and who may connect (`docs/security.md`, ADR-0102).
//!
//! A Unix-socket caller is trusted like a process of the same pod, so the socket must only
//! be reachable by such processes: the directory is private to our uid (0750, never group-
//! or world-writable, never owned by someone else, so nobody can swap a socket file), the
//! sockets are 0660, and every accepted connection's kernel-reported credentials
//! (`SO_PEERCRED`) must match our uid or a configured group.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of a socket directory this process creates (or tightens).
pub const SOCKET_DIR_MODE: u32 = 0o750;
/// Mode of every socket file this process binds.
pub const SOCKET_FILE_MODE: u32 = 0o660;

/// Why a socket directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum SocketDirError {
    #[error("socket directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("socket directory {path} is not a directory (symlinks are refused too)")]
    NotADirectory { path: PathBuf },
    #[error("socket directory {path} is owned by uid {owner}, not by this process's uid {uid}")]
    ForeignOwner { path: PathBuf, owner: u32, uid: u32 },
    #[error(
        "socket directory {path} has mode {mode:04o}: group- or world-writable directories let another user replace the sockets (use 0750)"
    )]
    Writable { path: PathBuf, mode: u32 },
}

/// Creates `dir` with mode 0750 if missing, then checks it: a real directory, owned by this
/// process's uid, not writable by group or others. Read/search bits for others on a
/// directory we own are tightened to 0750 rather than refused.
pub fn prepare_socket_dir(dir: &Path) -> Result<(), SocketDirError> {
    let io = |source| SocketDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    match std::fs::DirBuilder::new().mode(SOCKET_DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io)?;
    if !meta.file_type().is_dir() {
        return Err(SocketDirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let uid = current_uid();
    if meta.uid() != uid {
        return Err(SocketDirError::ForeignOwner {
            path: dir.to_path_buf(),
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(SocketDirError::Writable {
            path: dir.to_path_buf(),
            mode,
        });
    }
    if mode & 0o007 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))
            .map_err(io)?;
    }
    Ok(())
}

/// Sets a freshly bound socket file to 0660.
pub(crate) fn restrict_socket_file(path: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_FILE_MODE))
}

/// This process's real uid.
pub fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Who may connect to this process's Unix sockets: the same uid, or members of one group
/// (e.g. a pod's shared `fsGroup`, when containers run as different users).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPeers {
    uid: u32,
    gid: Option<u32>,
}

impl LocalPeers {
    /// Only processes running as this process's uid.
    pub fn same_user() -> Self {
        Self {
            uid: current_uid(),
            gid: None,
        }
    }

    /// Also processes whose primary gid is `gid`.
    pub fn with_group(self, gid: Option<u32>) -> Self {
        Self { gid, ..self }
    }

    /// Whether a peer with these kernel-reported credentials may talk to us.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        uid == self.uid || self.gid == Some(gid)
    }
}

impl Default for LocalPeers {
    fn default() -> Self {
        Self::same_user()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_missing_directory_is_created_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/run");
        prepare_socket_dir(&dir).unwrap();
        assert_eq!(mode_of(&dir), SOCKET_DIR_MODE);
    }

    #[test]
    fn world_or_group_writable_directories_are_refused() {
        for mode in [0o777, 0o770, 0o702, 0o1777] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("run");
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = prepare_socket_dir(&dir).unwrap_err();
            assert!(
                matches!(err, SocketDirError::Writable { .. }),
                "{mode:o}: {err}"
            );
        }
    }

    #[test]
    fn readable_directories_we_own_are_tightened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_socket_dir(&dir).unwrap();
        assert_eq!(mode_of(&dir), SOCKET_DIR_MODE);
    }

    #[test]
    fn symlinks_and_files_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("real");
        std::fs::create_dir(&target).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            prepare_socket_dir(&link),
            Err(SocketDirError::NotADirectory { .. })
        ));
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(prepare_socket_dir(&file).is_err());
    }

    #[test]
    fn directories_of_another_user_are_refused() {
        // Only root can hand a directory to another uid; elsewhere this is covered by the
        // ownership comparison alone.
        if current_uid() != 0 {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        rustix::fs::chown(
            &dir,
            Some(rustix::fs::Uid::from_raw(4242)),
            Some(rustix::fs::Gid::from_raw(4242)),
        )
        .unwrap();
        assert!(matches!(
            prepare_socket_dir(&dir),
            Err(SocketDirError::ForeignOwner { owner: 4242, .. })
        ));
    }

    #[test]
    fn peers_must_share_our_uid_or_the_configured_group() {
        let me = LocalPeers::same_user();
        let uid = current_uid();
        assert!(me.allows(uid, 12345));
        assert!(!me.allows(uid.wrapping_add(1), 12345));
        let grouped = me.with_group(Some(12345));
        assert!(grouped.allows(uid.wrapping_add(1), 12345));
        assert!(!grouped.allows(uid.wrapping_add(1), 54321));
    }
}
