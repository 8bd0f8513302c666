//! The product's binaries for end-to-end tests, built on first use (a no-op when `cargo test
//! --workspace` built them already) into the same target directory and profile as the test.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::Error;

/// The packages whose binaries the end-to-end tests run (the harness's own: the node's `pause`).
const PACKAGES: [&str; 4] = [
    "sharder-webhook",
    "sharder-reconciler",
    "sharder-example",
    "sharder-harness",
];

fn build() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    // <target>/<profile>/deps/<test binary>, or <target>/<profile>/<binary> (`cargo run`).
    let dir = exe.parent().ok_or("the binary has no folder")?;
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().ok_or("no profile folder")?
    } else {
        dir
    }
    .to_path_buf();
    let target_dir = profile_dir
        .parent()
        .ok_or("no target directory")?
        .to_path_buf();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_owned(),
        Some(other) => other.to_owned(),
        None => return Err("no profile directory".to_owned()),
    };
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command
        .arg("build")
        .arg("--locked")
        .arg("--bins")
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .args(["--profile", &profile]);
    for package in PACKAGES {
        command.args(["-p", package]);
    }
    let output = command
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(profile_dir)
}

/// The path of the binary `name` (`sharder-webhook`, `sharder-reconciler`,
/// `checksum-controller`, `pause`), built first if needed.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = BUILT.get_or_init(build).clone().map_err(Error::Build)?;
    Ok(dir.join(name))
}
