//! Makes sure the toolchain building the guests has the `wasm32-wasip2`
//! target: a fresh toolchain (installed from rust-toolchain.toml) often has
//! only the host target. Shared by host/build.rs and host/tests/build_target.rs.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const TARGET: &str = "wasm32-wasip2";

/// The one command that fixes a missing target by hand.
pub const INSTALL_COMMAND: &str = "rustup target add wasm32-wasip2";

/// The sysroot of `rustc` as run from `dir` (where rust-toolchain.toml applies).
fn sysroot(rustc: &OsStr, dir: &Path) -> Result<PathBuf, String> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", rustc.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "{} --print sysroot failed: {}",
            rustc.to_string_lossy(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn installed(sysroot: &Path) -> bool {
    sysroot.join("lib/rustlib").join(TARGET).is_dir()
}

/// `Ok(None)` when the target is there, `Ok(Some(note))` after installing it
/// with `rustup`, `Err` (naming [`INSTALL_COMMAND`]) when that is not possible.
pub fn ensure(rustc: &OsStr, rustup: &OsStr, dir: &Path) -> Result<Option<String>, String> {
    let root = sysroot(rustc, dir)?;
    if installed(&root) {
        return Ok(None);
    }
    let fail = |why: String| {
        format!(
            "the Rust target {TARGET} (needed to build the bundled guests) is not installed for the toolchain at {} \
             and installing it failed ({why}); run:\n\n    {INSTALL_COMMAND}\n",
            root.display()
        )
    };
    let out = Command::new(rustup)
        .args(["target", "add", TARGET])
        .current_dir(dir)
        .output()
        .map_err(|e| fail(format!("cannot run {}: {e}", rustup.to_string_lossy())))?;
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    if !installed(&root) {
        return Err(fail(format!(
            "rustup did not add {TARGET} to {}",
            root.display()
        )));
    }
    Ok(Some(format!(
        "installed the Rust target {TARGET} with `{INSTALL_COMMAND}`"
    )))
}
