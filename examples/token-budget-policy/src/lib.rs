//! A Qwasi policy guest with per-API-key request rates and token budgets,
//! on `qwasi-guest-sdk`.
//!
//! Settings (`--policy-setting KEY=VALUE`; `--api-key` arrives as `api-key`):
//!
//! | key | meaning |
//! |---|---|
//! | `key` / `api-key` (repeat) | `ID:SECRET` (the caller is `ID`) or `SECRET` (the caller is `key-` + 8 hex digits of its SHA-256). Requests must send `Authorization: Bearer SECRET`; none or an unknown one is a 401. At least one is required. |
//! | `requests-per-minute` | per key, 0 = unlimited (default) |
//! | `requests-per-minute.ID` | the same for key `ID` |
//! | `token-budget` | tokens per key and window, 0 = unlimited (default) |
//! | `token-budget.ID` | the same for key `ID` |
//! | `token-window` | the budget's window: `3600`, `90s`, `15m`, `1h`, `1d` (default `1h`) |
//! | `tokens-per-request` | what one generation request costs (required with a budget) |
//! | `generation-paths` | comma-separated paths that cost tokens (default: `/v1/completions`, `/v1/chat/completions`, `/api/generate`, `/api/chat`), POST only |
//!
//! What a request costs: admission runs before the body is read, and the
//! admission interface (WIT 0.1.1) sees only method, path, headers and
//! client address; `policy-state` counts requests, one per `incr`. So a
//! generation request is charged a fixed `tokens-per-request`; run the
//! server with `--max-completion-tokens` equal to it and the charge is an
//! upper bound of what the request can generate. Exceeding the rate or the
//! budget is a 429 with `Retry-After` (the seconds until the window resets).
//! Counters live in the host, shared by every instance of this policy, in
//! fixed windows aligned to the host clock. Bad settings fail closed (500).

use qwasi_guest_sdk::policy::{Counter, Decision, Denial, PolicyRequest, Settings};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Paths the host answers itself; always allowed.
const OPEN_PATHS: &[&str] = &["/health", "/ready", "/metrics"];
const DEFAULT_GENERATION_PATHS: &[&str] = &[
    "/v1/completions",
    "/v1/chat/completions",
    "/api/generate",
    "/api/chat",
];

#[derive(Clone)]
struct Key {
    id: String,
    digest: [u8; 32],
    rpm: u32,
    budget: u64,
}

/// The parsed settings.
pub struct Policy {
    keys: Vec<Key>,
    window_secs: u32,
    tokens_per_request: u64,
    generation_paths: Vec<String>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

impl Policy {
    pub fn from_settings(s: &Settings) -> Result<Policy, String> {
        let rpm: u32 = s.parse("requests-per-minute")?.unwrap_or(0);
        let budget: u64 = s.parse("token-budget")?.unwrap_or(0);
        let mut keys = Vec::new();
        for v in s.all("key").chain(s.all("api-key")) {
            let (id, secret) = match v.split_once(':') {
                Some((id, secret)) if valid_id(id) && !secret.is_empty() => {
                    (Some(id.to_owned()), secret)
                }
                _ => (None, v),
            };
            if secret.is_empty() || secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err("an API key is empty or contains whitespace".into());
            }
            let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
            let id = id.unwrap_or_else(|| {
                let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
                format!("key-{hex}")
            });
            keys.push(Key {
                id,
                digest,
                rpm,
                budget,
            });
        }
        if keys.is_empty() {
            return Err("no API key is configured (--policy-setting key=ID:SECRET)".into());
        }
        for (id, v) in s.with_prefix("requests-per-minute") {
            let n = v
                .parse()
                .map_err(|_| format!("setting `requests-per-minute.{id}` is not a number"))?;
            key_mut(&mut keys, id, "requests-per-minute")?.rpm = n;
        }
        for (id, v) in s.with_prefix("token-budget") {
            let n = v
                .parse()
                .map_err(|_| format!("setting `token-budget.{id}` is not a number"))?;
            key_mut(&mut keys, id, "token-budget")?.budget = n;
        }
        let tokens_per_request: u64 = s.parse("tokens-per-request")?.unwrap_or(0);
        if keys.iter().any(|k| k.budget > 0) && tokens_per_request == 0 {
            return Err("a token budget needs `tokens-per-request` (> 0)".into());
        }
        let generation_paths = match s.get("generation-paths") {
            Some(v) => v
                .split(',')
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect(),
            None => DEFAULT_GENERATION_PATHS
                .iter()
                .map(|p| p.to_string())
                .collect(),
        };
        Ok(Policy {
            keys,
            window_secs: s.duration_secs("token-window")?.unwrap_or(3600),
            tokens_per_request,
            generation_paths,
        })
    }

    /// The key whose secret is `token`: every key is compared, in constant
    /// time over SHA-256 digests.
    fn find(&self, token: &str) -> Option<&Key> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for (i, k) in self.keys.iter().enumerate() {
            let eq = digest.ct_eq(&k.digest);
            index = u32::conditional_select(&index, &(i as u32), eq & !found);
            found |= eq;
        }
        bool::from(found).then(|| &self.keys[index as usize])
    }

    pub fn check(&self, req: &PolicyRequest, counter: &dyn Counter) -> Decision {
        let path = req.path_only();
        if OPEN_PATHS.contains(&path) {
            return Decision::Allow(None);
        }
        let Some(token) = req.bearer_token() else {
            return Decision::Deny(Denial::unauthorized(
                "Missing API key: send it as `Authorization: Bearer KEY`.",
            ));
        };
        let Some(key) = self.find(token) else {
            return Decision::Deny(Denial::unauthorized("Incorrect API key provided."));
        };
        if key.rpm > 0 {
            let c = counter.incr(&format!("rpm:{}", key.id), 60);
            if c.count > u64::from(key.rpm) {
                return Decision::Deny(Denial::too_many_requests(
                    "rate_limit_exceeded",
                    format!(
                        "Rate limit reached for `{}`: {} requests per minute. Retry in {} s.",
                        key.id,
                        key.rpm,
                        c.reset_after.max(1)
                    ),
                    c.reset_after,
                ));
            }
        }
        let generation = req.method == "POST" && self.generation_paths.iter().any(|p| p == path);
        if key.budget > 0 && generation {
            let c = counter.incr(&format!("tokens:{}", key.id), self.window_secs);
            let used = c.count.saturating_mul(self.tokens_per_request);
            if used > key.budget {
                let spent = (c.count - 1).saturating_mul(self.tokens_per_request);
                return Decision::Deny(Denial::too_many_requests(
                    "token_budget_exceeded",
                    format!(
                        "Token budget exhausted for `{}`: {} of {} tokens per {} s used, and a request costs {}. Retry in {} s.",
                        key.id,
                        spent.min(key.budget),
                        key.budget,
                        self.window_secs,
                        self.tokens_per_request,
                        c.reset_after.max(1)
                    ),
                    c.reset_after,
                ));
            }
        }
        Decision::Allow(Some(key.id.clone()))
    }
}

fn key_mut<'a>(keys: &'a mut [Key], id: &str, setting: &str) -> Result<&'a mut Key, String> {
    keys.iter_mut()
        .find(|k| k.id == id)
        .ok_or(format!("setting `{setting}.{id}` names no configured key"))
}

/// Decides on one request with the given settings; bad settings fail closed.
pub fn decide(settings: &Settings, req: &PolicyRequest, counter: &dyn Counter) -> Decision {
    match Policy::from_settings(settings) {
        Ok(p) => p.check(req, counter),
        Err(e) => Decision::Deny(Denial::misconfigured(&e)),
    }
}

#[cfg(target_arch = "wasm32")]
mod component {
    use qwasi_guest_sdk::policy::{Decision, PolicyRequest};
    use qwasi_guest_sdk::policy_host::{HostCounter, PolicyGuest, settings};

    struct TokenBudget;

    impl PolicyGuest for TokenBudget {
        fn check(request: PolicyRequest) -> Decision {
            super::decide(&settings(), &request, &HostCounter)
        }
    }

    qwasi_guest_sdk::export_policy!(TokenBudget);
}

#[cfg(test)]
mod tests {
    use super::*;
    use qwasi_guest_sdk::policy::MemoryCounter;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        Settings::new(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn req(method: &str, path: &str, token: Option<&str>) -> PolicyRequest {
        PolicyRequest {
            method: method.into(),
            path: path.into(),
            headers: token
                .map(|t| vec![("authorization".into(), format!("Bearer {t}"))])
                .unwrap_or_default(),
            remote_addr: "127.0.0.1:1".into(),
        }
    }

    fn denial(d: Decision) -> Denial {
        match d {
            Decision::Deny(d) => d,
            Decision::Allow(c) => panic!("allowed as {c:?}"),
        }
    }

    const BASE: &[(&str, &str)] = &[
        ("key", "alice:sk-a"),
        ("key", "bob:sk-b"),
        ("api-key", "sk-anon"),
        ("requests-per-minute", "100"),
        ("requests-per-minute.bob", "2"),
        ("token-budget", "30"),
        ("token-budget.bob", "0"),
        ("tokens-per-request", "10"),
        ("token-window", "1h"),
    ];

    #[test]
    fn keys() {
        let s = settings(BASE);
        let c = MemoryCounter::default();
        let d = denial(decide(&s, &req("GET", "/v1/models", None), &c));
        assert_eq!((d.status, d.code.as_str()), (401, "invalid_api_key"));
        assert!(d.message.contains("Missing"));
        let d = denial(decide(&s, &req("GET", "/v1/models", Some("sk-x")), &c));
        assert_eq!(d.status, 401);
        assert!(d.message.contains("Incorrect"));
        assert_eq!(
            decide(&s, &req("GET", "/v1/models", Some("sk-a")), &c),
            Decision::Allow(Some("alice".into()))
        );
        match decide(&s, &req("GET", "/v1/models", Some("sk-anon")), &c) {
            Decision::Allow(Some(id)) => assert!(id.starts_with("key-") && id.len() == 12),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&s, &req("GET", "/health", None), &c),
            Decision::Allow(None)
        );
    }

    #[test]
    fn token_budget() {
        let s = settings(BASE);
        let c = MemoryCounter::default();
        c.now.set(3600 * 10 + 100);
        let gen_req = req("POST", "/v1/chat/completions?x=1", Some("sk-a"));
        for _ in 0..3 {
            assert_eq!(
                decide(&s, &gen_req, &c),
                Decision::Allow(Some("alice".into()))
            );
        }
        // Other paths and methods cost nothing.
        assert!(matches!(
            decide(&s, &req("GET", "/v1/models", Some("sk-a")), &c),
            Decision::Allow(_)
        ));
        assert!(matches!(
            decide(&s, &req("GET", "/api/chat", Some("sk-a")), &c),
            Decision::Allow(_)
        ));
        let d = denial(decide(&s, &req("POST", "/api/generate", Some("sk-a")), &c));
        assert_eq!((d.status, d.code.as_str()), (429, "token_budget_exceeded"));
        assert_eq!(d.retry_after, Some(3500));
        assert!(
            d.message.contains("30 of 30 tokens per 3600 s"),
            "{}",
            d.message
        );
        // bob has no budget (override 0), only the rate.
        for _ in 0..2 {
            assert!(matches!(
                decide(&s, &gen_req_for("sk-b"), &c),
                Decision::Allow(_)
            ));
        }
        // The next window.
        c.now.set(3600 * 11);
        assert!(matches!(decide(&s, &gen_req, &c), Decision::Allow(_)));
    }

    fn gen_req_for(token: &str) -> PolicyRequest {
        req("POST", "/api/chat", Some(token))
    }

    #[test]
    fn rate_limit() {
        let s = settings(BASE);
        let c = MemoryCounter::default();
        c.now.set(60 * 5 + 20);
        for _ in 0..2 {
            assert!(matches!(
                decide(&s, &req("GET", "/v1/models", Some("sk-b")), &c),
                Decision::Allow(_)
            ));
        }
        let d = denial(decide(&s, &req("GET", "/v1/models", Some("sk-b")), &c));
        assert_eq!((d.status, d.code.as_str()), (429, "rate_limit_exceeded"));
        assert_eq!(d.retry_after, Some(40));
        // alice's limit is her own.
        assert!(matches!(
            decide(&s, &req("GET", "/v1/models", Some("sk-a")), &c),
            Decision::Allow(_)
        ));
        c.now.set(60 * 6);
        assert!(matches!(
            decide(&s, &req("GET", "/v1/models", Some("sk-b")), &c),
            Decision::Allow(_)
        ));
    }

    #[test]
    fn bad_settings_fail_closed() {
        let c = MemoryCounter::default();
        let r = req("GET", "/v1/models", Some("sk-a"));
        for bad in [
            &[("requests-per-minute", "x"), ("key", "a:sk-a")][..],
            &[("token-budget", "5"), ("key", "a:sk-a")][..],
            &[("key", "a:sk-a"), ("token-budget.zed", "5")][..],
            &[("key", "a:sk-a"), ("token-window", "1w")][..],
            &[][..],
        ] {
            let d = denial(decide(&settings(bad), &r, &c));
            assert_eq!(
                (d.status, d.code.as_str()),
                (500, "policy_misconfigured"),
                "{bad:?}"
            );
        }
        let custom = settings(&[
            ("key", "a:sk-a"),
            ("token-budget", "1"),
            ("tokens-per-request", "1"),
            ("generation-paths", "/x, /y"),
        ]);
        assert!(matches!(
            decide(&custom, &req("POST", "/x", Some("sk-a")), &c),
            Decision::Allow(_)
        ));
        assert!(matches!(
            decide(&custom, &req("POST", "/api/chat", Some("sk-a")), &c),
            Decision::Allow(_)
        ));
        assert_eq!(
            denial(decide(&custom, &req("POST", "/y", Some("sk-a")), &c)).status,
            429
        );
    }
}
