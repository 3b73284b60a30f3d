//! What `qwasi start` / `status` / `stop` and `serve` need from the operating
//! system, on Unix and on Windows (which has no signals).
//!
//! * Unix: `start` detaches the server with `setsid`; `stop` sends SIGTERM
//!   (SIGKILL with `--force`); `serve` stops on SIGINT / SIGTERM.
//! * Windows: `start` detaches it as a process without a console; `stop`
//!   writes the server's stop file (`server-HOST-PORT.stop` next to its state
//!   file) and, with `--force`, terminates it; `serve` stops on Ctrl-C /
//!   Ctrl-Break / closing its console.
//!
//! On both, a server with a state directory also stops when its stop file
//! appears, so the Linux tests exercise what Windows relies on; a second stop
//! request during the drain ends it at once, like a second signal.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How often `serve` looks for its stop file.
const STOP_FILE_POLL: Duration = Duration::from_millis(200);

/// Whether process `pid` is running (exists and, on Unix, is not a zombie).
#[cfg(unix)]
pub fn running(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let exists = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

#[cfg(windows)]
pub fn running(pid: u32) -> bool {
    use windows_sys::Win32::Foundation::{CloseHandle, STILL_ACTIVE};
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
    };
    // SAFETY: a handle opened here, queried, and closed.
    unsafe {
        let h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
        if h.is_null() {
            return false;
        }
        let mut code = 0u32;
        let ok = GetExitCodeProcess(h, &mut code) != 0;
        CloseHandle(h);
        ok && code == STILL_ACTIVE as u32
    }
}

/// Makes the server `cmd` starts outlive the command that started it (its
/// own session on Unix; no console and its own process group on Windows).
pub fn detach(cmd: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe; it detaches the server from our
        // session and terminal so it outlives this command.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    }
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        const DETACHED_PROCESS: u32 = 0x0000_0008;
        const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP);
    }
}

/// Asks server `pid` to stop gracefully: SIGTERM on Unix, its stop file
/// (which `serve` watches, see [`StopRequests`]) on Windows.
pub fn request_stop(pid: u32, stop_file: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let _ = stop_file;
        // SAFETY: plain signal to a recorded pid.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        Ok(())
    }
    #[cfg(windows)]
    {
        let _ = pid;
        std::fs::write(stop_file, b"stop\n")
            .with_context(|| format!("cannot write the stop file {}", stop_file.display()))
    }
}

/// Ends process `pid` at once (SIGKILL; TerminateProcess on Windows).
pub fn kill(pid: u32) {
    #[cfg(unix)]
    // SAFETY: plain signal to a recorded pid.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
    #[cfg(windows)]
    // SAFETY: a handle opened here, used once, and closed.
    unsafe {
        use windows_sys::Win32::Foundation::CloseHandle;
        use windows_sys::Win32::System::Threading::{
            OpenProcess, PROCESS_TERMINATE, TerminateProcess,
        };
        let h = OpenProcess(PROCESS_TERMINATE, 0, pid);
        if !h.is_null() {
            TerminateProcess(h, 1);
            CloseHandle(h);
        }
    }
}

/// Asks a child `qwasi serve` to stop gracefully (SIGTERM); on Windows, where
/// a child without a state directory has no stop file, it is terminated.
pub fn stop_child(child: &mut std::process::Child) {
    #[cfg(unix)]
    // SAFETY: signalling our own child process by its pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    #[cfg(windows)]
    {
        let _ = child.kill();
    }
}

/// The requests to stop `serve`: SIGINT / SIGTERM (Unix), Ctrl-C / Ctrl-Break /
/// console close (Windows), and the stop file where the server has one.
pub struct StopRequests {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(windows)]
    ctrl_c: tokio::signal::windows::CtrlC,
    #[cfg(windows)]
    ctrl_break: tokio::signal::windows::CtrlBreak,
    #[cfg(windows)]
    ctrl_close: tokio::signal::windows::CtrlClose,
    stop_file: Option<PathBuf>,
}

impl StopRequests {
    /// Starts listening; a stop file left from an earlier run is removed.
    pub fn new(stop_file: Option<PathBuf>) -> Result<Self> {
        if let Some(p) = &stop_file {
            let _ = std::fs::remove_file(p);
        }
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(StopRequests {
                int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
                term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
                stop_file,
            })
        }
        #[cfg(windows)]
        {
            use tokio::signal::windows;
            Ok(StopRequests {
                ctrl_c: windows::ctrl_c().context("Ctrl-C handler")?,
                ctrl_break: windows::ctrl_break().context("Ctrl-Break handler")?,
                ctrl_close: windows::ctrl_close().context("console-close handler")?,
                stop_file,
            })
        }
    }

    /// The next stop request.
    pub async fn recv(&mut self) {
        let file = stop_file_appears(self.stop_file.as_deref());
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = file => {}
        }
        #[cfg(windows)]
        tokio::select! {
            _ = self.ctrl_c.recv() => {}
            _ = self.ctrl_break.recv() => {}
            _ = self.ctrl_close.recv() => {}
            _ = file => {}
        }
    }
}

/// Resolves when `path` exists (then removes it, so the next request is a
/// new file); never without a path.
async fn stop_file_appears(path: Option<&Path>) {
    let Some(path) = path else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(STOP_FILE_POLL).await;
        if path.exists() {
            let _ = std::fs::remove_file(path);
            return;
        }
    }
}
