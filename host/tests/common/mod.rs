//! Shared helpers for the server tests: a real `qwasi serve` process on
//! 127.0.0.1 (port 0), and a tiny raw HTTP/1.1 client.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const QWASI: &str = env!("CARGO_BIN_EXE_qwasi");

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The tiny dense fixture: ~1000 tokens/s on one core, 4096-token context.
pub fn fixture_model() -> String {
    repo_root()
        .join("tests/fixtures/models/dense")
        .display()
        .to_string()
}

/// Runs `qwasi ARGS...` to its end (without the caller's QWASI_API_KEY).
pub fn qwasi(args: &[&str]) -> std::process::Output {
    Command::new(QWASI)
        .args(args)
        .env_remove("QWASI_API_KEY")
        .output()
        .expect("run qwasi")
}

/// The misbehaving test guest built by host/build.rs.
pub fn misbehave_guest() -> String {
    let p = env!("QWASI_TEST_GUEST_MISBEHAVE");
    assert!(
        !p.is_empty(),
        "the test guest tests/guests/misbehave was not built (see the build warnings)"
    );
    p.to_string()
}

/// Compiled components shared by all tests of this build.
pub fn compile_cache() -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("qwasi-compile-cache")
        .display()
        .to_string()
}

pub struct Server {
    pub child: Child,
    pub addr: String,
    /// stdout + stderr lines so far (collected by a thread).
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// `qwasi serve --port 0 --model <fixture> ARGS...`, waiting until it is ready.
    pub fn start(args: &[&str]) -> Server {
        Self::start_with(args, true)
    }

    pub fn start_with(args: &[&str], with_model: bool) -> Server {
        let mut cmd = Command::new(QWASI);
        cmd.arg("serve").args(["--port", "0", "--compile-cache"]);
        cmd.arg(compile_cache());
        if !args.contains(&"--host") {
            cmd.args(["--host", "127.0.0.1"]);
        }
        if with_model {
            cmd.args(["--model", &fixture_model(), "--threads", "1"]);
        }
        cmd.args(args)
            .env_remove("QWASI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn qwasi serve");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<String>();
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
        ] {
            let tx = tx.clone();
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            });
        }
        let t0 = Instant::now();
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("qwasi: listening on http://") {
                        break rest.trim().to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().unwrap();
                    panic!(
                        "qwasi serve exited ({status}) before listening:\n{}",
                        log.lock().unwrap().join("\n")
                    );
                }
            }
            if t0.elapsed() > Duration::from_secs(180) {
                let _ = child.kill();
                panic!(
                    "qwasi serve did not start:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Server { child, addr, log }
    }

    pub fn get(&self, path: &str) -> Resp {
        request(&self.addr, "GET", path, &[], "")
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits until the log holds `needle`: a thread copies the server's
    /// stderr into the log, so a line can arrive after what it reports
    /// became visible over HTTP.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let t0 = Instant::now();
        while !self.log_text().contains(needle) {
            assert!(
                t0.elapsed() < timeout,
                "the log never showed {needle:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    /// Waits for the process to exit (panics after `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if t0.elapsed() > timeout {
                let _ = self.child.kill();
                panic!(
                    "server did not exit within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// `error.code` of an OpenAI-style error object.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// Sends a request and returns the stream, positioned after the request.
pub fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Reads a whole response (Connection: close).
pub fn read_response(mut s: TcpStream) -> Resp {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse(&buf)
}

pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    read_response(send(addr, method, path, headers, body))
}

/// Reads until the response head is complete; returns (status, rest of the bytes read).
pub fn read_head(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_string();
            let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
            return (status, buf[i + 4..].to_vec());
        }
        let n = s.read(&mut chunk).expect("read head");
        assert!(
            n > 0,
            "connection closed before the response head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn parse(buf: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(buf).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Polls `f` until it returns true (panics after `timeout`).
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `running` from /health's queue.
pub fn running(server: &Server) -> u64 {
    server.get("/health").json()["queue"]["running"]
        .as_u64()
        .unwrap_or(0)
}

pub fn queued(server: &Server) -> u64 {
    server.get("/health").json()["queue"]["queued"]
        .as_u64()
        .unwrap_or(0)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A copy of the bundled OpenAI guest (host/build.rs).
pub fn openai_guest() -> String {
    let p = env!("QWASI_TEST_GUEST_OPENAI");
    assert!(!p.is_empty(), "the bundled OpenAI guest was not built");
    p.to_string()
}

/// A copy of the bundled policy guest (host/build.rs).
pub fn policy_guest() -> String {
    let p = env!("QWASI_TEST_GUEST_POLICY");
    assert!(!p.is_empty(), "the bundled policy guest was not built");
    p.to_string()
}

/// `wasm` with a custom section appended: the same component, other bytes
/// (a "new version" that behaves the same).
pub fn with_custom_section(wasm: &[u8], tag: &str) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let name = "qwasi-test";
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(tag.as_bytes());
    let mut out = wasm.to_vec();
    out.push(0);
    leb(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// The example command component examples/batch-complete (host/build.rs).
pub fn batch_complete() -> String {
    let p = env!("QWASI_EXAMPLE_BATCH_COMPLETE");
    assert!(
        !p.is_empty(),
        "examples/batch-complete was not built (see the build warnings)"
    );
    p.to_string()
}

/// Replaces `dest` atomically: writes a temporary file next to it, then renames.
pub fn replace_file(dest: &std::path::Path, bytes: &[u8]) {
    let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, dest).unwrap();
}

/// The value of a Prometheus sample line `name` (exact, labels included).
pub fn metric(server: &Server, name: &str) -> Option<f64> {
    server.get("/metrics").body.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}
