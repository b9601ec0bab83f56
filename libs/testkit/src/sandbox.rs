//! Ports, temp dirs and socket paths for tests and the local mesh. Port reservation is
//! `bigfleet_mesh::ports` (production code `bigfleet up` shares), re-exported here.

use std::path::{Path, PathBuf};

use crate::TestkitError;

pub use bigfleet_mesh::ports::PortReservation;

/// Reserves a loopback TCP port; see [`PortReservation`].
pub fn reserve_tcp_port() -> std::io::Result<PortReservation> {
    bigfleet_mesh::ports::reserve_loopback_port()
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a child process that must be
/// told its port up front (prefer binding `127.0.0.1:0` in-process and reading it back).
/// Still racy against other users of this function, but not against the kernel's ephemeral
/// allocations; see [`reserve_tcp_port`].
pub fn free_tcp_port() -> std::io::Result<u16> {
    Ok(reserve_tcp_port()?.release().port())
}

/// A fresh temporary directory, removed when the returned guard drops.
pub fn temp_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix(prefix).tempdir()
}

/// `dir/name`, checked against the kernel's Unix socket path limit so a too-deep temp dir
/// fails with a clear message instead of an opaque bind error.
pub fn unix_socket_path(dir: &Path, name: &str) -> Result<PathBuf, TestkitError> {
    bigfleet_mesh::ports::unix_socket_path(dir, name).map_err(|len| {
        TestkitError::SocketPathTooLong {
            path: dir.join(name),
            len,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn free_port_can_be_bound() {
        let port = free_tcp_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    }

    #[test]
    fn a_released_port_is_never_handed_out_again() {
        let first = reserve_tcp_port().unwrap().release().port();
        for _ in 0..200 {
            let next = reserve_tcp_port().unwrap().release().port();
            assert_ne!(next, first, "port {first} handed out twice");
        }
    }

    #[test]
    fn another_process_cannot_claim_a_claimed_port() {
        let port = reserve_tcp_port().unwrap().release().port();
        // A second open file description stands in for another process: flock conflicts
        // between descriptions, not only between processes.
        let other = std::fs::OpenOptions::new()
            .write(true)
            .open(
                std::env::temp_dir()
                    .join("bigfleet-ports")
                    .join(port.to_string()),
            )
            .unwrap();
        assert!(
            matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
            "claim on {port} not held"
        );
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
