//! Loopback TCP ports reserved for a child process that must be told its port before it
//! starts: `bigfleet up`'s children and the test suites' servers take them from here, so
//! the two never hand out the same port. Also the kernel's Unix socket path limit.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Longest Unix socket path the kernel accepts (`sun_path` is 108 bytes incl. the NUL).
pub const MAX_UNIX_PATH: usize = 107;

/// A loopback port held open until the child that must bind it is about to start.
///
/// The port comes from outside the kernel's ephemeral range when there is room, so no
/// outgoing connection and no `bind(:0)` anywhere on the machine can land on it between
/// [`PortReservation::release`] and the child's own bind — the race that made parallel
/// suites fail with "address already in use" when ports came from `bind(:0)`.
///
/// A port is also *claimed* for the life of the process that reserved it (see
/// `claim_port`): no other reservation in this process or in any other process on the
/// machine gets the same port again, even after it is released. Without the claim, two
/// test processes (nextest runs one per test) picking at random from the same quiet range,
/// or one test asking twice in a row, could be handed a port that a sibling child was about
/// to bind; the child then died at start-up with "address already in use" (issue 22).
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

    /// Frees the port for the child and returns it. The claim stays (see the type's docs).
    pub fn release(self) -> SocketAddr {
        self.addr()
    }
}

/// Reserves a loopback TCP port; see [`PortReservation`].
pub fn reserve_loopback_port() -> std::io::Result<PortReservation> {
    if let Some((lo, hi)) = quiet_port_range() {
        let seeds = RandomState::new();
        for attempt in 0u32..256 {
            let span = u64::from(hi - lo);
            let port = lo + u16::try_from(seeds.hash_one(attempt) % span).expect("below span");
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) => {
                    if claim_port(port)? {
                        return Ok(PortReservation { listener });
                    }
                }
                Err(e)
                    if matches!(e.kind(), ErrorKind::AddrInUse | ErrorKind::PermissionDenied) => {}
                Err(e) => return Err(e),
            }
        }
    }
    // No quiet range (or it is crowded): the kernel's choice, claimed like any other.
    for _ in 0..64 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        if claim_port(listener.local_addr()?.port())? {
            return Ok(PortReservation { listener });
        }
    }
    Err(std::io::Error::new(
        ErrorKind::AddrNotAvailable,
        "no loopback port could be claimed",
    ))
}

/// Ports this process has claimed, with the open lock files that hold the claims.
static CLAIMS: Mutex<Option<(HashSet<u16>, Vec<File>)>> = Mutex::new(None);

/// Claims `port` for the rest of this process's life, machine-wide among the processes that
/// use this function: `false` when this process or another live one already holds it.
///
/// The claim is an exclusive `flock` on `<tmp>/bigfleet-ports/<port>`; the kernel drops it
/// when the process exits however it exits, so a crashed test never leaks a port.
fn claim_port(port: u16) -> std::io::Result<bool> {
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

/// Fewest ports worth picking from at random.
const MIN_QUIET_PORTS: u16 = 1024;

/// Up to 16K unprivileged ports just below the ephemeral range (or just above it when
/// it starts too low), `None` when neither side has room.
fn quiet_port_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let (lo, hi) = parse_port_range(&text)?;
    quiet_range_outside(lo, hi)
}

fn parse_port_range(text: &str) -> Option<(u16, u16)> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let lo = it.next()?.ok()?;
    let hi = it.next()?.ok()?;
    (lo <= hi).then_some((lo, hi))
}

fn quiet_range_outside(eph_lo: u16, eph_hi: u16) -> Option<(u16, u16)> {
    const FIRST_UNPRIVILEGED: u32 = 1024;
    const WIDTH: u32 = 16 * 1024;
    let (eph_lo, eph_hi) = (u32::from(eph_lo), u32::from(eph_hi));
    let below = (eph_lo.saturating_sub(WIDTH).max(FIRST_UNPRIVILEGED), eph_lo);
    let above = (eph_hi + 1, (eph_hi + 1 + WIDTH).min(u32::from(u16::MAX)));
    [below, above]
        .into_iter()
        .find(|(lo, hi)| *hi >= *lo + u32::from(MIN_QUIET_PORTS))
        .map(|(lo, hi)| {
            (
                u16::try_from(lo).expect("within port range"),
                u16::try_from(hi).expect("within port range"),
            )
        })
}

/// `dir/name` if it fits the kernel's Unix socket path limit; otherwise the path's length.
pub fn unix_socket_path(dir: &Path, name: &str) -> Result<PathBuf, usize> {
    let path = dir.join(name);
    let len = path.as_os_str().len();
    if len > MAX_UNIX_PATH {
        return Err(len);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_holds_its_port_until_released_and_is_never_handed_out_twice() {
        let r = reserve_loopback_port().unwrap();
        let addr = r.addr();
        assert!(addr.ip().is_loopback());
        assert_eq!(
            TcpListener::bind(addr).unwrap_err().kind(),
            ErrorKind::AddrInUse
        );
        assert_eq!(r.release(), addr);
        TcpListener::bind(addr).unwrap();
        // Still claimed by this process: not handed out again.
        assert!(!claim_port(addr.port()).unwrap(), "{addr} claimed twice");
    }

    #[test]
    fn reserved_ports_avoid_the_ephemeral_range() {
        let Some((lo, hi)) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|t| parse_port_range(&t))
        else {
            return;
        };
        if quiet_range_outside(lo, hi).is_none() {
            return;
        }
        for _ in 0..20 {
            let port = reserve_loopback_port().unwrap().addr().port();
            assert!(!(lo..=hi).contains(&port), "{port} is in {lo}-{hi}");
        }
    }

    #[test]
    fn quiet_ranges() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_port_range("9 8"), None);
        assert_eq!(parse_port_range("x"), None);
        assert_eq!(quiet_range_outside(32768, 60999), Some((16384, 32768)));
        assert_eq!(quiet_range_outside(10000, 60999), Some((1024, 10000)));
        // No room below: take the ports above.
        assert_eq!(quiet_range_outside(1024, 40000), Some((40001, 56385)));
        assert_eq!(quiet_range_outside(1024, 65535), None);
        assert_eq!(quiet_range_outside(1500, 65000), None);
    }

    #[test]
    fn socket_paths_are_checked_against_the_kernel_limit() {
        let dir = Path::new("/tmp");
        assert_eq!(unix_socket_path(dir, "a.sock").unwrap(), dir.join("a.sock"));
        assert_eq!(unix_socket_path(dir, &"x".repeat(120)), Err(125));
    }
}
