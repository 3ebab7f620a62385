//! Free loopback ports. A port is found by binding port 0 and releasing it:
//! another process may take it before the test binds it again, a race that
//! is acceptable in tests (and rare: the kernel hands ports out in turn).

use std::net::{SocketAddr, TcpListener};

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    free_port_on("127.0.0.1")
}

/// `127.0.0.1:PORT` with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// `n` different free loopback ports (bound at once so they differ, then
/// released).
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A free port on `ip` (any 127.x.y.z is loopback on Linux).
pub fn free_port_on(ip: &str) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("cannot bind a port on {ip}: {e}"))
        .port()
}

/// The loopback address of node `id` of a cluster in this test process:
/// `127.0.X.Y`, a different address per node and spread by the process id,
/// so clusters of test binaries running at once rarely meet even when a
/// port is reused.
pub fn loopback_ip(id: u64) -> String {
    let base = 20 + u64::from(std::process::id() % 200);
    format!("127.0.{}.{}", (base + id) / 250, (base + id) % 250 + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_found_together_differ() {
        let ports = free_ports(8).unwrap();
        let unique: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(unique.len(), 8, "{ports:?}");
    }

    #[test]
    fn node_addresses_are_loopback_and_distinct() {
        let ips: Vec<String> = (1..=5).map(loopback_ip).collect();
        for ip in &ips {
            let addr: std::net::Ipv4Addr = ip.parse().unwrap();
            assert!(addr.is_loopback(), "{ip}");
        }
        assert_eq!(ips.iter().collect::<std::collections::BTreeSet<_>>().len(), 5);
    }
}
