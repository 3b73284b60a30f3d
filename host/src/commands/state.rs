//! State files of background servers (`qwasi start/status/stop`): one JSON file
//! per host:port under `--state-dir`, `$XDG_RUNTIME_DIR/qwasi` or `~/.qwasi`.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Record {
    pub pid: u32,
    pub host: String,
    pub port: u16,
    pub url: String,
    /// Unix seconds.
    pub started_at: u64,
    pub log_file: String,
    pub model: Option<String>,
}

/// How a server's stop ended, written next to its state file as it exits
/// (`qwasi stop` reports it).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StopReport {
    pub pid: u32,
    /// `drained`, `drain_timeout` or `second_signal`.
    pub outcome: String,
    pub drained: bool,
    /// Requests cancelled by the hard stop.
    pub cut_requests: usize,
    /// Seconds from the stop signal to exit.
    pub stop_s: f64,
}

pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("qwasi");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".qwasi"),
        None => PathBuf::from(".qwasi"),
    }
}

pub struct StateFile {
    dir: PathBuf,
    stem: String,
}

impl StateFile {
    pub fn new(dir: &Path, host: &str, port: u16) -> Self {
        let host: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        StateFile {
            dir: dir.to_path_buf(),
            stem: format!("server-{host}-{port}"),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.stem))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.stem))
    }

    fn stop_report_path(&self) -> PathBuf {
        self.dir.join(format!("{}.stopped.json", self.stem))
    }

    pub fn write_stop_report(&self, r: &StopReport) {
        if let Ok(text) = serde_json::to_string(r) {
            let _ = std::fs::write(self.stop_report_path(), text);
        }
    }

    /// The report `pid` left when it stopped (removed once read).
    pub fn take_stop_report(&self, pid: u32) -> Option<StopReport> {
        let text = std::fs::read_to_string(self.stop_report_path()).ok()?;
        let r: StopReport = serde_json::from_str(&text).ok()?;
        let _ = std::fs::remove_file(self.stop_report_path());
        (r.pid == pid).then_some(r)
    }

    /// The file whose appearance stops the server (`qwasi stop` on Windows;
    /// see `platform`).
    pub fn stop_path(&self) -> PathBuf {
        self.dir.join(format!("{}.stop", self.stem))
    }

    pub fn read(&self) -> Option<Record> {
        read_record(&self.path())
    }

    pub fn write(&self, r: &Record) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create the state directory {}", self.dir.display()))?;
        let tmp = self
            .dir
            .join(format!("{}.json.{}.tmp", self.stem, std::process::id()));
        std::fs::write(&tmp, serde_json::to_string_pretty(r)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, self.path())
            .with_context(|| format!("cannot write {}", self.path().display()))?;
        Ok(())
    }

    /// Removes the file if it still names this process.
    pub fn remove(&self) {
        if self.read().is_some_and(|r| r.pid == std::process::id()) {
            let _ = std::fs::remove_file(self.path());
        }
    }

    pub fn remove_any(&self) {
        let _ = std::fs::remove_file(self.path());
    }
}

pub fn read_record(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// All state files in `dir`.
pub fn list(dir: &Path) -> Vec<(PathBuf, Record)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("server-")
                && name.ends_with(".json")
                && let Some(r) = read_record(&p)
            {
                out.push((p, r));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The address a client on this machine uses for a server bound to `host`.
pub fn connect_addr(host: &str, port: u16) -> String {
    let h = match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "::" | "[::]" => "[::1]",
        h if h.contains(':') && !h.starts_with('[') => return format!("[{h}]:{port}"),
        h => h,
    };
    format!("{h}:{port}")
}

/// A minimal HTTP/1.1 GET (for /health and /ready): status and body.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String)> {
    let sa = addr
        .to_socket_addrs()
        .with_context(|| format!("bad address {addr}"))?
        .next()
        .with_context(|| format!("bad address {addr}"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad HTTP response from {addr}"))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The one record a command without --port refers to.
pub fn pick(dir: &Path, host: &str, port: Option<u16>) -> Result<(StateFile, Record)> {
    if let Some(port) = port {
        let sf = StateFile::new(dir, host, port);
        let r = sf.read().with_context(|| {
            format!(
                "no qwasi server recorded for {host}:{port} in {}",
                dir.display()
            )
        })?;
        return Ok((sf, r));
    }
    let all = list(dir);
    match all.len() {
        0 => bail!("no qwasi server is recorded in {}", dir.display()),
        1 => {
            let r = all.into_iter().next().unwrap().1;
            Ok((StateFile::new(dir, &r.host, r.port), r))
        }
        n => bail!(
            "{n} qwasi servers are recorded in {}; pass --port (and --host)",
            dir.display()
        ),
    }
}
