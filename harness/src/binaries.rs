//! The product's binaries for end-to-end tests: built on first use into the same target
//! directory and profile as the test, or taken as they are from `SHARDER_BINARIES`.
//!
//! The build here resolves features without the workspace's dev-dependencies, so after a
//! `cargo test --workspace` it compiles the product's dependencies once more: `make test`
//! (harness/run-tests.sh) builds every target in one resolution and names the folder in
//! `SHARDER_BINARIES` instead.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::Error;
use crate::supervisor::blocking;

/// The packages whose binaries the end-to-end tests run (the harness's own: the node's `pause`).
const PACKAGES: [&str; 4] = [
    "sharder-webhook",
    "sharder-reconciler",
    "sharder-example",
    "sharder-harness",
];

/// The folder of binaries already built (`make test` sets it), used without building.
const BUILT: &str = "SHARDER_BINARIES";

fn build() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(BUILT) {
        return Ok(PathBuf::from(dir));
    }
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
    let output = blocking(|| command.output()).map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(profile_dir)
}

/// The path of the binary `name` (`sharder-webhook`, `sharder-reconciler`,
/// `checksum-controller`, `pause`), built first if needed (unless `SHARDER_BINARIES` is set).
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let path = DIR
        .get_or_init(build)
        .clone()
        .map_err(Error::Build)?
        .join(name);
    if !path.is_file() {
        return Err(Error::Build(format!(
            "{} is missing ({BUILT}, when set, names a folder holding the binaries of {})",
            path.display(),
            PACKAGES.join(", ")
        )));
    }
    Ok(path)
}
