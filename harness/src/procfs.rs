//! What `/proc` says of a process, for tests and benchmarks that count its resources.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};

/// Sockets process `pid` holds open (its connections and listeners), from `/proc/<pid>/fd`;
/// `None` if the process is gone.
pub fn open_sockets(pid: u32) -> Option<usize> {
    Some(socket_inodes(pid)?.len())
}

/// The established TCP connections process `pid` holds to `port` (on any address), as their
/// sockets' inodes, from `/proc/<pid>/net/tcp` and `tcp6` matched against its sockets; `None`
/// if the process is gone.
pub fn connections_to(pid: u32, port: u16) -> Option<HashSet<String>> {
    let inodes = socket_inodes(pid)?;
    let mut connections = HashSet::new();
    for table in ["tcp", "tcp6"] {
        // No tcp6 table without IPv6.
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        connections.extend(text.lines().skip(1).filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // rem_address is fields[2] ("0100007F:1A0B"), st fields[3] (01: established),
            // inode fields[9].
            let remote_port = fields
                .get(2)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            let inode = fields.get(9)?;
            (remote_port == Some(port) && fields.get(3) == Some(&"01") && inodes.contains(*inode))
                .then(|| (*inode).to_owned())
        }));
    }
    Some(connections)
}

/// The IPv4 TCP addresses process `pid` listens on, from `/proc/<pid>/net/tcp` matched against
/// its sockets; `None` if the process is gone.
pub fn listening(pid: u32) -> Option<Vec<SocketAddr>> {
    let inodes = socket_inodes(pid)?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    Some(
        text.lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // local_address is fields[1] ("0100007F:1F90": the address's bytes in host order,
                // the port), st fields[3] (0A: listening), inode fields[9].
                if fields.get(3) != Some(&"0A") || !inodes.contains(*fields.get(9)?) {
                    return None;
                }
                let (ip, port) = fields.get(1)?.split_once(':')?;
                let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
                Some(SocketAddr::from((ip, u16::from_str_radix(port, 16).ok()?)))
            })
            .collect(),
    )
}

/// The inodes of the sockets process `pid` holds open (`socket:[<inode>]` in `/proc/<pid>/fd`).
fn socket_inodes(pid: u32) -> Option<HashSet<String>> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        entries
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_string_lossy();
                let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
                Some(inode.to_owned())
            })
            .collect(),
    )
}

/// Resident set size now and its peak (`VmRSS`, `VmHWM`) of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    Some((status_kib(pid, "VmRSS:")?, status_kib(pid, "VmHWM:")?))
}

/// The field `name` (such as `RssAnon:`) of `/proc/<pid>/status`, in KiB.
pub fn status_kib(pid: u32, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::{listening, rss_kib};

    #[test]
    fn a_bound_listener_is_found_at_its_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let found = listening(std::process::id()).expect("this process");
        assert!(found.contains(&addr), "{addr} not in {found:?}");
        drop(listener);
        let found = listening(std::process::id()).expect("this process");
        assert!(!found.contains(&addr), "{addr} still in {found:?}");
    }

    #[test]
    fn this_process_has_a_resident_set() {
        let (now, peak) = rss_kib(std::process::id()).expect("rss");
        assert!(now > 0 && peak >= now);
    }
}
