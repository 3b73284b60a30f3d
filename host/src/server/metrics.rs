//! Host-side Prometheus metrics (appended to the engine's).

use super::AppState;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct HostMetrics {
    pub guest_instances: AtomicU64,
    pub guest_instantiate_us: AtomicU64,
    pub guest_traps: AtomicU64,
    pub guest_cpu_exceeded: AtomicU64,
    pub request_timeouts: AtomicU64,
    pub client_disconnects: AtomicU64,
    pub policy_denials: AtomicU64,
    pub policy_errors: AtomicU64,
}

impl HostMetrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String, state: &AppState) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        counter(
            "qwasi_guest_instances_total",
            "API guest instances created (one per request).",
            get(&self.guest_instances),
        );
        counter(
            "qwasi_guest_instantiate_microseconds_total",
            "Time spent instantiating API guests.",
            get(&self.guest_instantiate_us),
        );
        counter(
            "qwasi_guest_traps_total",
            "Guest requests that failed with a trap (crash, memory exhaustion, CPU limit).",
            get(&self.guest_traps),
        );
        counter(
            "qwasi_guest_cpu_limit_exceeded_total",
            "Guest requests stopped for exceeding the guest CPU limit.",
            get(&self.guest_cpu_exceeded),
        );
        counter(
            "qwasi_request_timeouts_total",
            "Requests stopped by the wall-clock request timeout.",
            get(&self.request_timeouts),
        );
        counter(
            "qwasi_client_disconnects_total",
            "Requests whose client went away before the response ended.",
            get(&self.client_disconnects),
        );
        counter(
            "qwasi_policy_denials_total",
            "Requests denied by the policy guest.",
            get(&self.policy_denials),
        );
        counter(
            "qwasi_policy_errors_total",
            "Policy guest failures (trap or timeout).",
            get(&self.policy_errors),
        );
        if let Some(rt) = state.runtime() {
            let escape = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "# HELP qwasi_guest_reloads_total Reloads of file-backed guests (mount prefix or \"policy\") by result.\n\
                 # TYPE qwasi_guest_reloads_total counter"
            );
            for slot in rt.slots().filter(|s| s.source.file().is_some()) {
                let g = escape(&slot.name);
                for (result, c) in [("ok", &slot.reloads_ok), ("error", &slot.reloads_err)] {
                    let _ = writeln!(
                        out,
                        "qwasi_guest_reloads_total{{guest=\"{g}\",result=\"{result}\"}} {}",
                        get(c)
                    );
                }
            }
            let _ = writeln!(
                out,
                "# HELP qwasi_guest_version Version of each guest now serving (1 at start, +1 per reload).\n\
                 # TYPE qwasi_guest_version gauge"
            );
            for slot in rt.slots() {
                let _ = writeln!(
                    out,
                    "qwasi_guest_version{{guest=\"{}\"}} {}",
                    escape(&slot.name),
                    slot.current().version
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP qwasi_http_requests_in_flight API requests in flight.\n\
             # TYPE qwasi_http_requests_in_flight gauge\nqwasi_http_requests_in_flight {}",
            state.in_flight()
        );
        let _ = writeln!(
            out,
            "# HELP qwasi_connections_open Connections being served.\n\
             # TYPE qwasi_connections_open gauge\nqwasi_connections_open {}\n\
             # HELP qwasi_pending_bodies Requests whose body is still arriving.\n\
             # TYPE qwasi_pending_bodies gauge\nqwasi_pending_bodies {}",
            state.connections.open(),
            state.pending.total()
        );
        let _ = writeln!(
            out,
            "# HELP qwasi_ready 1 when the server admits requests.\n\
             # TYPE qwasi_ready gauge\nqwasi_ready {}",
            u8::from(state.phase() == super::Phase::Ready)
        );
    }
}
