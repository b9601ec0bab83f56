//! Ports, temp dirs and socket paths for tests and the local mesh.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};

use crate::TestkitError;

/// Longest Unix socket path the kernel accepts (`sun_path` is 108 bytes incl. the NUL).
const MAX_UNIX_PATH: usize = 107;

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// Inherently racy (another process may take it before you bind it); prefer binding
/// `127.0.0.1:0` in-process and reading the address back. This is for child processes that
/// must be told their port up front.
pub fn free_tcp_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// A fresh temporary directory, removed when the returned guard drops.
pub fn temp_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir()
}

/// `dir/name`, checked against the kernel's Unix socket path limit so a too-deep temp dir
/// fails with a clear message instead of an opaque bind error.
pub fn unix_socket_path(dir: &Path, name: &str) -> Result<PathBuf, TestkitError> {
    let path = dir.join(name);
    let len = path.as_os_str().len();
    if len > MAX_UNIX_PATH {
        return Err(TestkitError::SocketPathTooLong { path, len });
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_can_be_bound() {
        let port = free_tcp_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    }

    #[test]
    fn socket_paths_respect_the_kernel_limit() {
        let dir = temp_dir("bf-sock").unwrap();
        let ok = unix_socket_path(dir.path(), "decide.sock").unwrap();
        assert!(ok.ends_with("decide.sock"));
        std::os::unix::net::UnixListener::bind(&ok).unwrap();
        let long = "x".repeat(120);
        assert!(matches!(
            unix_socket_path(dir.path(), &long),
            Err(TestkitError::SocketPathTooLong { .. })
        ));
    }
}
