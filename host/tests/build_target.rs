//! host/build.rs's check for the wasm32-wasip2 target, against a fake
//! toolchain: a `rustc` that names a sysroot and a `rustup` that installs
//! into it (or fails).
#![cfg(unix)]

#[path = "../build/wasm_target.rs"]
mod wasm_target;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn installs_a_missing_target_or_names_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let sysroot = dir.path().join("sysroot");
    std::fs::create_dir_all(sysroot.join("lib/rustlib")).unwrap();
    let rustc = dir.path().join("rustc");
    script(&rustc, &format!("echo {}", sysroot.display()));
    let target_dir = sysroot.join("lib/rustlib/wasm32-wasip2");

    // rustup fails: the error names the one command.
    let failing = dir.path().join("rustup-fails");
    script(&failing, "echo 'error: no network' >&2; exit 1");
    let e = wasm_target::ensure(rustc.as_os_str(), failing.as_os_str(), dir.path()).unwrap_err();
    assert!(e.contains("rustup target add wasm32-wasip2"), "{e}");
    assert!(e.contains("no network"), "{e}");
    // No rustup at all: the same.
    let missing = dir.path().join("no-such-rustup");
    let e = wasm_target::ensure(rustc.as_os_str(), missing.as_os_str(), dir.path()).unwrap_err();
    assert!(e.contains("rustup target add wasm32-wasip2"), "{e}");

    // rustup installs it (checking the arguments it was given).
    let rustup = dir.path().join("rustup");
    script(
        &rustup,
        &format!(
            "[ \"$1 $2 $3\" = 'target add wasm32-wasip2' ] || exit 2\nmkdir -p {}",
            target_dir.display()
        ),
    );
    let note = wasm_target::ensure(rustc.as_os_str(), rustup.as_os_str(), dir.path()).unwrap();
    assert!(note.unwrap().contains("installed"));
    assert!(target_dir.is_dir());
    // Present: nothing to do (rustup is not run).
    assert_eq!(
        wasm_target::ensure(rustc.as_os_str(), failing.as_os_str(), dir.path()).unwrap(),
        None
    );
}
