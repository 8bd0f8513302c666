//! What `/proc` says of a process, for tests and benchmarks that count its resources.

/// Sockets process `pid` holds open (its connections and listeners), from `/proc/<pid>/fd`;
/// `None` if the process is gone.
pub fn open_sockets(pid: u32) -> Option<usize> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        entries
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count(),
    )
}
