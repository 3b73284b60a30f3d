//! Admission policies as plain Rust: what `admission.check` sees
//! ([`PolicyRequest`]), what it returns ([`Decision`], [`Denial`]), the
//! operator's `--policy-setting KEY=VALUE` pairs ([`Settings`]) and the
//! host-kept fixed-window counters ([`Counter`], backed by `policy-state`
//! in the component).

use std::str::FromStr;

/// `admission.request-meta`: no body (admission runs before it is read).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// Client address, e.g. "127.0.0.1:50123".
    pub remote_addr: String,
}

impl PolicyRequest {
    /// The path without query or fragment.
    pub fn path_only(&self) -> &str {
        self.path.split(['?', '#']).next().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        crate::http::header(&self.headers, name)
    }

    /// The token of `Authorization: Bearer <token>`.
    pub fn bearer_token(&self) -> Option<&str> {
        crate::http::bearer_token(&self.headers)
    }

    /// The client's IP without the port ("[::1]:5" -> "::1").
    pub fn client_ip(&self) -> &str {
        let a = self.remote_addr.as_str();
        if let Some(rest) = a.strip_prefix('[') {
            return rest.split(']').next().unwrap_or(rest);
        }
        match a.rsplit_once(':') {
            Some((ip, port)) if !ip.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => ip,
            _ => a,
        }
    }
}

/// `admission.denial`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub status: u16,
    /// OpenAI-style code, e.g. `invalid_api_key`.
    pub code: String,
    pub message: String,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u32>,
}

impl Denial {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        Denial {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// 401 `invalid_api_key`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, "invalid_api_key", message)
    }

    /// 429 with `Retry-After` (at least 1 s).
    pub fn too_many_requests(code: &str, message: impl Into<String>, retry_after: u32) -> Self {
        Denial {
            retry_after: Some(retry_after.max(1)),
            ..Self::new(429, code, message)
        }
    }

    /// 500 `policy_misconfigured`: fail closed on bad settings.
    pub fn misconfigured(error: &str) -> Self {
        Self::new(
            500,
            "policy_misconfigured",
            format!("The server's request policy is misconfigured: {error}"),
        )
    }
}

/// `admission.decision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admit; the value names the caller (quotas, prefix-cache isolation).
    Allow(Option<String>),
    Deny(Denial),
}

/// `policy-state.window-count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCount {
    /// Requests counted in the current window, this one included.
    pub count: u64,
    /// Whole seconds until the window resets.
    pub reset_after: u32,
}

/// Host-kept fixed-window counters, shared by all instances of the policy
/// (each request gets a fresh instance, so guest memory cannot count).
pub trait Counter {
    /// Adds 1 to `key`'s counter in the current window of `window_secs`
    /// seconds (aligned to the host clock) and returns the new count.
    fn incr(&self, key: &str, window_secs: u32) -> WindowCount;
}

/// An in-memory [`Counter`] for tests, with a settable clock.
#[derive(Debug, Default)]
pub struct MemoryCounter {
    pub now: std::cell::Cell<u64>,
    counts: std::cell::RefCell<std::collections::HashMap<(String, u32, u64), u64>>,
}

impl Counter for MemoryCounter {
    fn incr(&self, key: &str, window_secs: u32) -> WindowCount {
        let w = u64::from(window_secs.max(1));
        let now = self.now.get();
        let start = now - now % w;
        let mut c = self.counts.borrow_mut();
        let n = c.entry((key.to_owned(), window_secs, start)).or_insert(0);
        *n += 1;
        WindowCount {
            count: *n,
            reset_after: (start + w - now) as u32,
        }
    }
}

/// The operator's settings (`--policy-setting KEY=VALUE`, and `--api-key`
/// as `api-key`), in order; keys may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings(pub Vec<(String, String)>);

impl Settings {
    pub fn new(pairs: Vec<(String, String)>) -> Self {
        Settings(
            pairs
                .into_iter()
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
        )
    }

    /// The last value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every (suffix, value) of keys `prefix.suffix` (e.g. per-key overrides).
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.0.iter().filter_map(move |(k, v)| {
            let rest = k.strip_prefix(prefix)?.strip_prefix('.')?;
            Some((rest, v.as_str()))
        })
    }

    /// The last value of `key` parsed; `Ok(None)` when absent.
    pub fn parse<T: FromStr>(&self, key: &str) -> Result<Option<T>, String> {
        self.get(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("setting `{key}` has an invalid value {v:?}"))
            })
            .transpose()
    }

    /// A duration in whole seconds: `90`, `90s`, `15m`, `1h`, `1d`.
    pub fn duration_secs(&self, key: &str) -> Result<Option<u32>, String> {
        self.get(key)
            .map(|v| {
                parse_duration_secs(v).ok_or(format!(
                    "setting `{key}` is not a duration (e.g. 60s, 15m, 1h): {v:?}"
                ))
            })
            .transpose()
    }
}

/// `90`, `90s`, `15m`, `1h`, `1d` -> seconds (at least 1).
pub fn parse_duration_secs(v: &str) -> Option<u32> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: u32 = v[..split].parse().ok()?;
    let mult = match v[split..].trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(mult).filter(|&s| s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_helpers() {
        let r = PolicyRequest {
            method: "POST".into(),
            path: "/api/chat?x=1".into(),
            headers: vec![("Authorization".into(), "Bearer k1".into())],
            remote_addr: "127.0.0.1:5000".into(),
        };
        assert_eq!(r.path_only(), "/api/chat");
        assert_eq!(r.bearer_token(), Some("k1"));
        assert_eq!(r.client_ip(), "127.0.0.1");
        let v6 = PolicyRequest {
            remote_addr: "[::1]:80".into(),
            ..r.clone()
        };
        assert_eq!(v6.client_ip(), "::1");
    }

    #[test]
    fn settings() {
        let s = Settings::new(vec![
            ("key".into(), " a:1 ".into()),
            ("key".into(), "b:2".into()),
            ("rpm".into(), "5".into()),
            ("rpm".into(), "6".into()),
            ("rpm.a".into(), "9".into()),
            ("window".into(), "2h".into()),
            ("bad".into(), "x".into()),
        ]);
        assert_eq!(s.all("key").collect::<Vec<_>>(), vec!["a:1", "b:2"]);
        assert_eq!(s.parse::<u32>("rpm"), Ok(Some(6)));
        assert_eq!(s.parse::<u32>("none"), Ok(None));
        assert!(s.parse::<u32>("bad").unwrap_err().contains("`bad`"));
        assert_eq!(s.with_prefix("rpm").collect::<Vec<_>>(), vec![("a", "9")]);
        assert_eq!(s.duration_secs("window"), Ok(Some(7200)));
        assert!(s.duration_secs("bad").is_err());
        assert_eq!(parse_duration_secs("90"), Some(90));
        assert_eq!(parse_duration_secs("15m"), Some(900));
        assert_eq!(parse_duration_secs("0s"), None);
        assert_eq!(parse_duration_secs("1w"), None);
    }

    #[test]
    fn denials_and_counter() {
        let d = Denial::too_many_requests("rate_limit_exceeded", "slow", 0);
        assert_eq!((d.status, d.retry_after), (429, Some(1)));
        assert_eq!(Denial::unauthorized("no").status, 401);
        let c = MemoryCounter::default();
        c.now.set(125);
        assert_eq!(
            c.incr("k", 60),
            WindowCount {
                count: 1,
                reset_after: 55
            }
        );
        assert_eq!(c.incr("k", 60).count, 2);
        assert_eq!(c.incr("k", 3600).count, 1);
        c.now.set(180);
        assert_eq!(
            c.incr("k", 60),
            WindowCount {
                count: 1,
                reset_after: 60
            }
        );
    }
}
