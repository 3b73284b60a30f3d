//! `qwasi start` / `status` / `stop`: a background server tracked by a state file.

use super::platform::{self, running};
use super::serve;
use super::state::{self, StateFile, connect_addr, default_state_dir, http_get};
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct StartArgs {
    #[command(flatten)]
    serve: serve::Args,
    /// How long to wait for the server to become ready.
    #[arg(long, default_value = "300s", value_parser = serve::parse_duration)]
    wait_timeout: Duration,
}

#[derive(clap::Args)]
pub struct TargetArgs {
    /// Host the server listens on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port of the server (optional when only one server is recorded).
    #[arg(long)]
    port: Option<u16>,
    /// Where `qwasi start` recorded the server (default: $XDG_RUNTIME_DIR/qwasi or ~/.qwasi).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: TargetArgs,
}

#[derive(clap::Args)]
pub struct StopArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// How long to wait for the graceful drain before giving up.
    #[arg(long, default_value = "150s", value_parser = serve::parse_duration)]
    timeout: Duration,
    /// Kill the server (SIGKILL; TerminateProcess on Windows) if it has not
    /// exited after --timeout.
    #[arg(long)]
    force: bool,
}

fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn start(a: StartArgs) -> Result<()> {
    serve::preflight(&a.serve)?;
    let host = a.serve.host.clone();
    let port = a.serve.port;
    if port == 0 {
        bail!(
            "qwasi start needs a fixed --port (0 picks a random one, which status/stop could not find)"
        );
    }
    let dir = a.serve.state_dir.clone().unwrap_or_else(default_state_dir);
    let sf = StateFile::new(&dir, &host, port);
    if let Some(r) = sf.read() {
        if running(r.pid) {
            bail!(
                "a qwasi server is already running on {host}:{port} (pid {}, {}); stop it first with `qwasi stop --port {port}`",
                r.pid,
                r.url
            );
        }
        sf.remove_any();
    }
    if let Err(e) = std::net::TcpListener::bind((host.as_str(), port)) {
        bail!("cannot listen on {host}:{port}: {e}");
    }
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
    let log_path = sf.log_path();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open the log file {}", log_path.display()))?;

    // The same command line with `serve` instead of `start`, minus start's
    // own flags and the API keys: a command line is world-readable
    // (`ps`, /proc/PID/cmdline), so the keys go through the environment
    // (`QWASI_API_KEY`, which `serve` reads; /proc/PID/environ is private
    // to the user).
    let mut args: Vec<OsString> = Vec::new();
    let mut it = std::env::args_os().skip(1);
    let mut replaced = false;
    while let Some(arg) = it.next() {
        let s = arg.to_string_lossy();
        if !replaced && s == "start" {
            args.push("serve".into());
            replaced = true;
        } else if s == "--wait-timeout" || s == "--api-key" {
            it.next();
        } else if s.starts_with("--wait-timeout=") || s.starts_with("--api-key=") {
        } else {
            args.push(arg);
        }
    }
    if a.serve.state_dir.is_none() {
        args.push("--state-dir".into());
        args.push(dir.clone().into());
    }
    let exe = std::env::current_exe().context("cannot find the qwasi executable")?;
    let mut cmd = Command::new(exe);
    // The keys as parsed here (from --api-key, or else QWASI_API_KEY);
    // none of them contains a comma (the flag splits on commas).
    let keys: Vec<&str> = a
        .serve
        .api_key
        .iter()
        .map(String::as_str)
        .filter(|k| !k.is_empty())
        .collect();
    if keys.is_empty() {
        cmd.env_remove(serve::API_KEY_ENV);
    } else {
        cmd.env(serve::API_KEY_ENV, keys.join(","));
    }
    cmd.args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    platform::detach(&mut cmd);
    let mut child = cmd.spawn().context("cannot start the server process")?;
    let pid = child.id();
    let addr = connect_addr(&host, port);
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the server exited during startup ({status}); its log {}:\n{}",
                log_path.display(),
                log_tail(&log_path, 20)
            );
        }
        if let Ok((200, _)) = http_get(&addr, "/ready", Duration::from_secs(2)) {
            break;
        }
        if t0.elapsed() > a.wait_timeout {
            let _ = platform::request_stop(pid, &sf.stop_path());
            bail!(
                "the server did not become ready within {:.0} s; stopped it. Its log {}:\n{}",
                a.wait_timeout.as_secs_f64(),
                log_path.display(),
                log_tail(&log_path, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{}",
        json!({
            "started": true,
            "pid": pid,
            "url": format!("http://{addr}"),
            "log_file": log_path.display().to_string(),
            "state_file": sf.path().display().to_string(),
            "ready_after_s": t0.elapsed().as_secs_f64(),
        })
    );
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let t = &a.target;
    let dir = t.state_dir.clone().unwrap_or_else(default_state_dir);
    let records: Vec<state::Record> = match t.port {
        Some(port) => StateFile::new(&dir, &t.host, port)
            .read()
            .into_iter()
            .collect(),
        None => state::list(&dir).into_iter().map(|(_, r)| r).collect(),
    };
    if records.is_empty() {
        println!(
            "{}",
            json!({"running": false, "state_dir": dir.display().to_string()})
        );
        bail!(
            "no qwasi server is running (nothing recorded in {})",
            dir.display()
        );
    }
    let mut all_ok = true;
    let mut out = Vec::new();
    for r in records {
        let alive = running(r.pid);
        let health = if alive {
            match http_get(
                &connect_addr(&r.host, r.port),
                "/health",
                Duration::from_secs(5),
            ) {
                Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body).ok(),
                _ => None,
            }
        } else {
            None
        };
        let ready = health
            .as_ref()
            .and_then(|h| h.get("state"))
            .and_then(|s| s.as_str())
            .map(str::to_owned);
        let healthy = health.is_some();
        all_ok &= alive && healthy;
        out.push(json!({
            "running": alive,
            "healthy": healthy,
            "state": ready,
            "pid": r.pid,
            "url": r.url,
            "host": r.host,
            "port": r.port,
            "model": r.model,
            "started_at": r.started_at,
            "log_file": r.log_file,
            "health": health,
        }));
    }
    let v = if out.len() == 1 {
        out.pop().unwrap()
    } else {
        serde_json::Value::Array(out)
    };
    println!("{}", serde_json::to_string_pretty(&v)?);
    if !all_ok {
        bail!("the qwasi server is not running or not healthy");
    }
    Ok(())
}

pub fn stop(a: StopArgs) -> Result<()> {
    let t = &a.target;
    let dir = t.state_dir.clone().unwrap_or_else(default_state_dir);
    let (sf, r) = state::pick(&dir, &t.host, t.port)?;
    if !running(r.pid) {
        sf.remove_any();
        bail!(
            "the qwasi server on {}:{} (pid {}) is not running; removed its stale state file",
            r.host,
            r.port,
            r.pid
        );
    }
    platform::request_stop(r.pid, &sf.stop_path())?;
    eprintln!("qwasi: stopping pid {} ({}): draining ...", r.pid, r.url);
    let t0 = Instant::now();
    while running(r.pid) {
        if t0.elapsed() > a.timeout {
            if a.force {
                platform::kill(r.pid);
                std::thread::sleep(Duration::from_millis(200));
                sf.remove_any();
                println!("{}", json!({"stopped": true, "forced": true, "pid": r.pid}));
                return Ok(());
            }
            bail!(
                "the server (pid {}) is still draining after {:.0} s; pass --force to kill it",
                r.pid,
                a.timeout.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sf.remove_any();
    let report = sf.take_stop_report(r.pid);
    let drained = report.as_ref().map(|s| s.drained);
    println!(
        "{}",
        json!({
            "stopped": true,
            "pid": r.pid,
            "after_s": t0.elapsed().as_secs_f64(),
            "drained": drained,
            "outcome": report.as_ref().map(|s| s.outcome.clone()),
            "cut_requests": report.as_ref().map(|s| s.cut_requests),
        })
    );
    if let Some(s) = report.filter(|s| !s.drained) {
        bail!(
            "the server stopped without draining ({}): {} request(s) in flight were cancelled",
            s.outcome,
            s.cut_requests
        );
    }
    Ok(())
}
