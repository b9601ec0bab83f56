//! Loopback ports for `bigfleet up`'s children, which must be told their ports before
//! they start.
//!
//! A port is held by a bound listener until the child's tier starts (dropping the
//! [`PortReservation`] frees it), and picked from outside the kernel's ephemeral range
//! when there is room, so no outgoing connection or `bind(:0)` elsewhere on the machine
//! lands on it between the release and the child's bind. Each port is also claimed for
//! the life of this process with an exclusive `flock` on `<tmp>/bigfleet-ports/<port>`
//! (the kernel drops it however the process exits): two `bigfleet up`s started side by
//! side, or a test suite reserving ports the same way (`bigfleet-testkit` uses the same
//! lock directory), are never handed the same port.

use std::collections::HashSet;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The kernel's limit on a Unix socket path (`sun_path` is 108 bytes with the NUL).
const MAX_UNIX_PATH: usize = 107;

/// Fewest ports worth picking from at random.
const MIN_QUIET_PORTS: u32 = 1024;

/// A loopback port held by a bound listener until dropped.
#[derive(Debug)]
pub struct PortReservation {
    listener: TcpListener,
}

impl PortReservation {
    /// The reserved address (127.0.0.1:port).
    pub fn addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }
}

/// Reserves a loopback TCP port; see the module docs.
pub fn reserve_loopback_port() -> std::io::Result<PortReservation> {
    if let Some((lo, hi)) = quiet_port_range() {
        let seeds = std::hash::RandomState::new();
        for attempt in 0u32..256 {
            let offset = seeds.hash_one(attempt) % u64::from(hi - lo);
            let port = lo + u16::try_from(offset).expect("below the range's width");
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) if claim(port)? => return Ok(PortReservation { listener }),
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), ErrorKind::AddrInUse | ErrorKind::PermissionDenied) => {}
                Err(e) => return Err(e),
            }
        }
    }
    // No quiet range (or it is crowded): the kernel's choice, claimed like any other.
    for _ in 0..64 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        if claim(listener.local_addr()?.port())? {
            return Ok(PortReservation { listener });
        }
    }
    Err(std::io::Error::new(
        ErrorKind::AddrNotAvailable,
        "no loopback port could be claimed",
    ))
}

/// `dir/name` if it fits the kernel's Unix socket path limit; otherwise the length.
pub fn unix_socket_path(dir: &Path, name: &str) -> Result<PathBuf, usize> {
    let path = dir.join(name);
    let len = path.as_os_str().len();
    if len > MAX_UNIX_PATH {
        return Err(len);
    }
    Ok(path)
}

/// Ports this process has claimed, with the open lock files holding the claims.
static CLAIMS: Mutex<Option<(HashSet<u16>, Vec<File>)>> = Mutex::new(None);

/// Claims `port` for the rest of this process's life: `false` when this process or
/// another live one already holds it.
fn claim(port: u16) -> std::io::Result<bool> {
    let mut claims = CLAIMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (taken, files) = claims.get_or_insert_with(Default::default);
    if taken.contains(&port) {
        return Ok(false);
    }
    let dir = std::env::temp_dir().join("bigfleet-ports");
    std::fs::create_dir_all(&dir)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))?;
    match file.try_lock() {
        Ok(()) => {
            taken.insert(port);
            files.push(file);
            Ok(true)
        }
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Up to 16K unprivileged ports just below the ephemeral range (or just above it).
fn quiet_port_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    (lo <= hi).then(|| quiet_range_outside(lo, hi))?
}

fn quiet_range_outside(eph_lo: u16, eph_hi: u16) -> Option<(u16, u16)> {
    const FIRST_UNPRIVILEGED: u32 = 1024;
    const WIDTH: u32 = 16 * 1024;
    let (eph_lo, eph_hi) = (u32::from(eph_lo), u32::from(eph_hi));
    let below = (eph_lo.saturating_sub(WIDTH).max(FIRST_UNPRIVILEGED), eph_lo);
    let above = (eph_hi + 1, (eph_hi + 1 + WIDTH).min(u32::from(u16::MAX)));
    [below, above]
        .into_iter()
        .find(|(lo, hi)| *hi >= *lo + MIN_QUIET_PORTS)
        .map(|(lo, hi)| {
            (
                u16::try_from(lo).expect("within the port range"),
                u16::try_from(hi).expect("within the port range"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_holds_its_port_until_dropped_and_is_never_handed_out_twice() {
        let a = reserve_loopback_port().unwrap();
        let b = reserve_loopback_port().unwrap();
        assert_ne!(a.addr(), b.addr());
        assert!(a.addr().ip().is_loopback());
        assert_eq!(
            TcpListener::bind(a.addr()).unwrap_err().kind(),
            ErrorKind::AddrInUse
        );
        let addr = a.addr();
        drop(a);
        TcpListener::bind(addr).unwrap();
        // Still claimed by this process: not handed out again.
        assert!(!claim(addr.port()).unwrap());
    }

    #[test]
    fn quiet_range_avoids_the_ephemeral_range() {
        assert_eq!(quiet_range_outside(32768, 60999), Some((16384, 32768)));
        assert_eq!(quiet_range_outside(1024, 60999), Some((61000, 65535)));
        assert_eq!(quiet_range_outside(1024, 65535), None);
    }

    #[test]
    fn socket_paths_are_checked_against_the_kernel_limit() {
        let dir = Path::new("/tmp");
        assert_eq!(unix_socket_path(dir, "a.sock").unwrap(), dir.join("a.sock"));
        assert_eq!(unix_socket_path(dir, &"x".repeat(120)), Err(125));
    }
}
