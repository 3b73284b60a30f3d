//! The policy logic, free of any WIT types so it is unit-tested natively.
//!
//! Settings (from `policy-config.settings`, unknown keys are ignored):
//! - `api-key` (may repeat): `secret`, or `id:secret` to name the caller. When
//!   at least one is configured every request must present one of them, as
//!   `Authorization: Bearer <secret>` or `x-api-key: <secret>`. The caller id
//!   (the given id, else `key-` plus 8 hex digits of the secret's SHA-256) is
//!   returned with `allow` for quotas and cache isolation.
//! - `max-requests-per-minute` (per caller; `0` = off). Enforcing it needs a
//!   counter shared by all instances (every request gets a fresh guest
//!   instance): see [`RateCounter`], backed by the host's `policy-state`
//!   interface (WIT 0.1.1) in the component.
//!
//! A malformed setting makes every request fail closed with 500
//! `policy_misconfigured` rather than silently running without auth.
//!
//! Keys are compared in constant time: both the presented and the configured
//! secrets are hashed with SHA-256 and the digests compared with
//! `subtle::ConstantTimeEq`, against every configured key without early exit,
//! so neither a key's content nor its length leaks through timing.

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Settings key for an API key (repeatable).
pub const SETTING_API_KEY: &str = "api-key";
/// Settings key for the per-caller request rate limit.
pub const SETTING_MAX_RPM: &str = "max-requests-per-minute";

/// Paths the host answers itself; `check` allows them regardless.
const OPEN_PATHS: &[&str] = &["/health", "/ready"];

/// At most this many presented credentials are tried per request.
const MAX_CANDIDATES: usize = 4;

/// The request as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// Path and query.
    pub path: &'a str,
    pub headers: &'a [(String, String)],
    /// Client address as text, e.g. "127.0.0.1:50123".
    pub remote_addr: &'a str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub retry_after: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admit; the value names the caller.
    Allow(Option<String>),
    Deny(Denial),
}

/// A fixed-window counter kept by the host and shared by all instances.
///
/// The component backs it with the host's `policy-state.incr` (WIT 0.1.1).
pub trait RateCounter {
    /// Atomically adds one to `key`'s counter in the current window of
    /// `window_secs` seconds; returns the new count and the whole seconds
    /// until the window resets.
    fn incr(&self, key: &str, window_secs: u32) -> (u64, u32);
}

#[derive(Clone)]
struct ApiKey {
    id: String,
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets or their digests.
        f.debug_struct("ApiKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The parsed settings.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    keys: Vec<ApiKey>,
    /// 0 = off.
    max_requests_per_minute: u32,
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex_prefix(digest: &[u8; 32], nbytes: usize) -> String {
    use std::fmt::Write;
    digest[..nbytes].iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
}

/// Parses one `api-key` value: `id:secret` when the part before the first
/// `:` is a valid id (`[A-Za-z0-9._@-]{1,64}`) and the secret is non-empty,
/// otherwise the whole value is the secret.
fn parse_api_key(value: &str) -> Result<ApiKey, String> {
    let value = value.trim();
    let (id, secret) = match value.split_once(':') {
        Some((id, secret)) if valid_id(id) && !secret.is_empty() => (Some(id), secret),
        _ => (None, value),
    };
    if secret.is_empty() {
        return Err(format!("setting `{SETTING_API_KEY}` has an empty key"));
    }
    if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "setting `{SETTING_API_KEY}`{} contains whitespace or control characters",
            id.map(|i| format!(" for id `{i}`")).unwrap_or_default()
        ));
    }
    let digest = sha256(secret.as_bytes());
    let id = match id {
        Some(id) => id.to_string(),
        None => format!("key-{}", hex_prefix(&digest, 4)),
    };
    Ok(ApiKey { id, digest })
}

impl Policy {
    /// Parses the operator's settings. Unknown keys are ignored (the host may
    /// pass settings meant for other policies).
    pub fn from_settings<K: AsRef<str>, V: AsRef<str>>(
        settings: &[(K, V)],
    ) -> Result<Policy, String> {
        let mut policy = Policy::default();
        for (key, value) in settings {
            let (key, value) = (key.as_ref().trim(), value.as_ref());
            match key {
                SETTING_API_KEY => {
                    let key = parse_api_key(value)?;
                    if policy.keys.iter().any(|k| k.id == key.id) {
                        // Two keys with one id would share a prefix cache and a quota.
                        return Err(format!(
                            "setting `{SETTING_API_KEY}`: two keys have the caller id `{}`",
                            key.id
                        ));
                    }
                    policy.keys.push(key);
                }
                SETTING_MAX_RPM => {
                    policy.max_requests_per_minute = value.trim().parse().map_err(|_| {
                        format!(
                            "setting `{SETTING_MAX_RPM}` must be a whole number >= 0, got {value:?}"
                        )
                    })?
                }
                _ => {}
            }
        }
        Ok(policy)
    }

    pub fn auth_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The caller ids of the configured keys, in order.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    pub fn max_requests_per_minute(&self) -> u32 {
        self.max_requests_per_minute
    }

    /// Decides on one request. `counter` is the host-kept state for rate
    /// limits; without it `max-requests-per-minute` is not enforced.
    pub fn check(&self, req: &Request<'_>, counter: Option<&dyn RateCounter>) -> Decision {
        let path = req.path.split(['?', '#']).next().unwrap_or("");
        if OPEN_PATHS.contains(&path) {
            return Decision::Allow(None);
        }

        let caller = if self.auth_enabled() {
            let candidates = presented_keys(req.headers);
            if candidates.is_empty() {
                return Decision::Deny(missing_key());
            }
            match self.find_key(&candidates) {
                Some(id) => Some(id),
                None => return Decision::Deny(incorrect_key(candidates[0])),
            }
        } else {
            None
        };

        if self.max_requests_per_minute > 0
            && let Some(counter) = counter
        {
            // Per caller id; anonymous callers are counted per client IP.
            let bucket = match &caller {
                Some(id) => format!("rpm:key:{id}"),
                None => format!("rpm:addr:{}", client_ip(req.remote_addr)),
            };
            let (count, reset_after) = counter.incr(&bucket, 60);
            if count > u64::from(self.max_requests_per_minute) {
                let retry = reset_after.max(1);
                return Decision::Deny(Denial {
                    status: 429,
                    code: "rate_limit_exceeded".into(),
                    message: format!(
                        "Rate limit reached for requests{}: limit {} / min. Please try again in {retry}s.",
                        caller
                            .as_deref()
                            .map(|id| format!(" by `{id}`"))
                            .unwrap_or_default(),
                        self.max_requests_per_minute
                    ),
                    retry_after: Some(retry),
                });
            }
        }

        Decision::Allow(caller)
    }

    /// Compares every candidate against every key in constant time (no early
    /// exit); returns the id of the (first) matching key.
    fn find_key(&self, candidates: &[&str]) -> Option<String> {
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for candidate in candidates {
            let digest = sha256(candidate.as_bytes());
            // `!found`: the first configured (and first presented) match wins.
            for (i, key) in self.keys.iter().enumerate() {
                let eq = digest.ct_eq(&key.digest);
                index = u32::conditional_select(&index, &(i as u32), eq & !found);
                found |= eq;
            }
        }
        bool::from(found).then(|| self.keys[index as usize].id.clone())
    }
}

/// The credentials a request presents: `Authorization: Bearer <key>` values,
/// then `x-api-key` values (header names are case-insensitive).
fn presented_keys(headers: &[(String, String)]) -> Vec<&str> {
    let mut bearer = Vec::new();
    let mut x_api_key = Vec::new();
    for (name, value) in headers {
        if name.eq_ignore_ascii_case("authorization") {
            let value = value.trim();
            if let Some((scheme, token)) = value.split_once(char::is_whitespace)
                && scheme.eq_ignore_ascii_case("bearer")
            {
                let token = token.trim();
                if !token.is_empty() {
                    bearer.push(token);
                }
            }
        } else if name.eq_ignore_ascii_case("x-api-key") {
            let value = value.trim();
            if !value.is_empty() {
                x_api_key.push(value);
            }
        }
    }
    bearer.extend(x_api_key);
    bearer.truncate(MAX_CANDIDATES);
    bearer
}

/// "1.2.3.4:5" -> "1.2.3.4", "[::1]:5" -> "::1"; anything else unchanged.
fn client_ip(remote_addr: &str) -> &str {
    if let Some(rest) = remote_addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match remote_addr.rsplit_once(':') {
        Some((ip, port)) if !ip.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => ip,
        _ => remote_addr,
    }
}

fn missing_key() -> Denial {
    Denial {
        status: 401,
        code: "invalid_api_key".into(),
        message: "Missing API key. You need to provide your API key in an Authorization header \
                  using Bearer auth (i.e. Authorization: Bearer YOUR_KEY) or in an x-api-key header."
            .into(),
        retry_after: None,
    }
}

fn incorrect_key(presented: &str) -> Denial {
    Denial {
        status: 401,
        code: "invalid_api_key".into(),
        message: format!("Incorrect API key provided: {}.", mask(presented)),
        retry_after: None,
    }
}

/// OpenAI-style masking: the first 3 and last 4 characters of keys of 12+
/// characters, nothing of shorter ones; non-printable characters become `?`.
fn mask(key: &str) -> String {
    let chars: Vec<char> = key
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if chars.len() < 12 {
        return "****".into();
    }
    let head: String = chars[..3].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}****{tail}")
}

/// What `check` returns when the settings cannot be parsed: fail closed.
pub fn misconfigured(error: &str) -> Decision {
    Decision::Deny(Denial {
        status: 500,
        code: "policy_misconfigured".into(),
        message: format!("The server's request policy is misconfigured: {error}"),
        retry_after: None,
    })
}

/// Parses the settings and checks the request in one go (what the component does).
pub fn decide<K: AsRef<str>, V: AsRef<str>>(
    settings: &[(K, V)],
    req: &Request<'_>,
    counter: Option<&dyn RateCounter>,
) -> Decision {
    match Policy::from_settings(settings) {
        Ok(policy) => policy.check(req, counter),
        Err(e) => misconfigured(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn req<'a>(path: &'a str, headers: &'a [(String, String)]) -> Request<'a> {
        Request {
            method: "POST",
            path,
            headers,
            remote_addr: "127.0.0.1:50123",
        }
    }

    fn policy(settings: &[(&str, &str)]) -> Policy {
        Policy::from_settings(settings).unwrap()
    }

    fn denial(d: Decision) -> Denial {
        match d {
            Decision::Deny(d) => d,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn no_keys_allows_everything_anonymously() {
        let p = policy(&[("other-setting", "x")]);
        assert!(!p.auth_enabled());
        let hs = h(&[]);
        assert_eq!(
            p.check(&req("/v1/chat/completions", &hs), None),
            Decision::Allow(None)
        );
        let hs = h(&[("authorization", "Bearer whatever")]);
        assert_eq!(
            p.check(&req("/v1/models", &hs), None),
            Decision::Allow(None)
        );
    }

    #[test]
    fn bearer_and_x_api_key_are_accepted() {
        let p = policy(&[("api-key", "sk-secret-one")]);
        for hs in [
            h(&[("authorization", "Bearer sk-secret-one")]),
            h(&[("Authorization", "bearer   sk-secret-one  ")]),
            h(&[("AUTHORIZATION", "BEARER sk-secret-one")]),
            h(&[("x-api-key", "sk-secret-one")]),
            h(&[("X-Api-Key", " sk-secret-one ")]),
            // A non-bearer Authorization (e.g. Basic) does not hide x-api-key.
            h(&[
                ("authorization", "Basic Zm9vOmJhcg=="),
                ("x-api-key", "sk-secret-one"),
            ]),
        ] {
            let d = p.check(&req("/v1/chat/completions", &hs), None);
            assert!(matches!(d, Decision::Allow(Some(_))), "{hs:?}: {d:?}");
        }
    }

    #[test]
    fn missing_key_is_401() {
        let p = policy(&[("api-key", "sk-secret-one")]);
        for hs in [
            h(&[]),
            h(&[("authorization", "Bearer ")]),
            h(&[("authorization", "Bearer")]),
            h(&[("authorization", "Basic Zm9vOmJhcg==")]),
            h(&[("x-api-key", "  ")]),
        ] {
            let d = denial(p.check(&req("/v1/completions", &hs), None));
            assert_eq!(d.status, 401);
            assert_eq!(d.code, "invalid_api_key");
            assert!(d.message.starts_with("Missing API key"), "{}", d.message);
            assert_eq!(d.retry_after, None);
        }
    }

    #[test]
    fn wrong_key_is_401_and_masked() {
        let p = policy(&[("api-key", "sk-secret-one")]);
        for (presented, shown) in [
            ("sk-secret-onf", "sk-****-onf"),
            ("sk-secret-one-longer", "sk-****nger"),
            ("sk-secret-on", "sk-****t-on"),
            ("short", "****"),
            ("sk-secret-one\u{1}xyzw", "sk-****xyzw"),
        ] {
            let hs = h(&[("authorization", &format!("Bearer {presented}"))]);
            let d = denial(p.check(&req("/v1/completions", &hs), None));
            assert_eq!(d.status, 401);
            assert_eq!(d.code, "invalid_api_key");
            assert_eq!(d.message, format!("Incorrect API key provided: {shown}."));
            assert!(!d.message.contains("sk-secret-one"), "{}", d.message);
        }
    }

    #[test]
    fn several_keys_and_caller_ids() {
        let p = policy(&[
            ("api-key", "alice:sk-alice-secret"),
            ("api-key", "sk-anonymous-secret"),
            ("api-key", "bob:sk-bob-secret"),
        ]);
        let ids: Vec<&str> = p.key_ids().collect();
        let anon_id = format!("key-{}", hex_prefix(&sha256(b"sk-anonymous-secret"), 4));
        assert_eq!(ids, ["alice", anon_id.as_str(), "bob"]);
        assert_eq!(anon_id.len(), "key-".len() + 8);
        for (key, id) in [
            ("sk-alice-secret", "alice"),
            ("sk-bob-secret", "bob"),
            ("sk-anonymous-secret", anon_id.as_str()),
        ] {
            let hs = h(&[("authorization", &format!("Bearer {key}"))]);
            assert_eq!(
                p.check(&req("/v1/models", &hs), None),
                Decision::Allow(Some(id.to_string()))
            );
        }
        // The `id:` prefix is not part of the secret.
        let hs = h(&[("authorization", "Bearer alice:sk-alice-secret")]);
        assert_eq!(denial(p.check(&req("/v1/models", &hs), None)).status, 401);
    }

    #[test]
    fn first_matching_key_names_the_caller() {
        let p = policy(&[("api-key", "a:same-secret"), ("api-key", "b:same-secret")]);
        let hs = h(&[("x-api-key", "same-secret")]);
        assert_eq!(
            p.check(&req("/v1/models", &hs), None),
            Decision::Allow(Some("a".into()))
        );
    }

    #[test]
    fn any_presented_credential_may_match() {
        let p = policy(&[("api-key", "bob:sk-bob-secret")]);
        let hs = h(&[
            ("authorization", "Bearer wrong-key-here"),
            ("x-api-key", "sk-bob-secret"),
        ]);
        assert_eq!(
            p.check(&req("/v1/models", &hs), None),
            Decision::Allow(Some("bob".into()))
        );
    }

    #[test]
    fn id_secret_parsing() {
        // Not a valid id before ':' -> the whole value is the secret.
        // ... which then fails for containing whitespace.
        assert!(Policy::from_settings(&[("api-key", "has space:secret")]).is_err());
        let p = policy(&[("api-key", ":sk-colon-first")]);
        let hs = h(&[("x-api-key", ":sk-colon-first")]);
        assert!(
            matches!(p.check(&req("/x", &hs), None), Decision::Allow(Some(id)) if id.starts_with("key-"))
        );
        // "id:" with an empty secret -> the whole value is the secret.
        let p = policy(&[("api-key", "abc:")]);
        let hs = h(&[("x-api-key", "abc:")]);
        assert!(matches!(
            p.check(&req("/x", &hs), None),
            Decision::Allow(Some(_))
        ));
        // Secrets may contain ':' after the id.
        let p = policy(&[("api-key", "svc:a:b:c")]);
        let hs = h(&[("x-api-key", "a:b:c")]);
        assert_eq!(
            p.check(&req("/x", &hs), None),
            Decision::Allow(Some("svc".into()))
        );
        // Surrounding whitespace in the setting is ignored.
        let p = policy(&[("api-key", "  sk-padded  \n")]);
        let hs = h(&[("x-api-key", "sk-padded")]);
        assert!(matches!(
            p.check(&req("/x", &hs), None),
            Decision::Allow(Some(_))
        ));
    }

    #[test]
    fn bad_settings_fail_closed() {
        for settings in [
            vec![("api-key", "")],
            vec![("api-key", "   ")],
            vec![("api-key", "id:sk with space")],
            vec![("max-requests-per-minute", "ten")],
            vec![("max-requests-per-minute", "-1")],
        ] {
            let hs = h(&[]);
            let d = denial(decide(&settings, &req("/v1/models", &hs), None));
            assert_eq!(d.status, 500, "{settings:?}");
            assert_eq!(d.code, "policy_misconfigured");
        }
        let derived = Policy::from_settings(&[("api-key", "sk-plain")])
            .unwrap()
            .key_ids()
            .next()
            .unwrap()
            .to_string();
        let twin = format!("{derived}:sk-other");
        let err = Policy::from_settings(&[("api-key", "sk-plain"), ("api-key", twin.as_str())])
            .unwrap_err();
        assert!(err.contains("two keys have the caller id"), "{err}");
        // The error never echoes a secret.
        let err = Policy::from_settings(&[("api-key", "id:sk with space")]).unwrap_err();
        assert!(!err.contains("sk with space"), "{err}");
    }

    #[test]
    fn health_and_ready_are_always_allowed() {
        let p = policy(&[
            ("api-key", "sk-secret-one"),
            ("max-requests-per-minute", "1"),
        ]);
        let hs = h(&[]);
        for path in ["/health", "/ready", "/health?verbose=1", "/ready#x"] {
            let r = Request {
                method: "GET",
                ..req(path, &hs)
            };
            assert_eq!(p.check(&r, None), Decision::Allow(None), "{path}");
        }
        for path in ["/healthz", "/v1/health", "/ready/x"] {
            assert_eq!(denial(p.check(&req(path, &hs), None)).status, 401, "{path}");
        }
    }

    #[derive(Default)]
    struct FakeCounter(RefCell<HashMap<String, u64>>);
    impl RateCounter for FakeCounter {
        fn incr(&self, key: &str, window_secs: u32) -> (u64, u32) {
            assert_eq!(window_secs, 60);
            let mut m = self.0.borrow_mut();
            let c = m.entry(key.to_string()).or_default();
            *c += 1;
            (*c, 17)
        }
    }

    #[test]
    fn rate_limit_per_key_with_host_counter() {
        let p = policy(&[
            ("api-key", "alice:sk-alice-secret"),
            ("api-key", "bob:sk-bob-secret"),
            ("max-requests-per-minute", "2"),
        ]);
        let counter = FakeCounter::default();
        let alice = h(&[("authorization", "Bearer sk-alice-secret")]);
        let bob = h(&[("authorization", "Bearer sk-bob-secret")]);
        let a = |hs| p.check(&req("/v1/completions", hs), Some(&counter));
        assert_eq!(a(&alice), Decision::Allow(Some("alice".into())));
        assert_eq!(a(&alice), Decision::Allow(Some("alice".into())));
        let d = denial(a(&alice));
        assert_eq!(
            (d.status, d.code.as_str(), d.retry_after),
            (429, "rate_limit_exceeded", Some(17))
        );
        assert!(d.message.contains("limit 2 / min"), "{}", d.message);
        // Bob has his own budget.
        assert_eq!(a(&bob), Decision::Allow(Some("bob".into())));
        // Unauthenticated requests are rejected before they count.
        let none = h(&[]);
        assert_eq!(denial(a(&none)).status, 401);
        assert_eq!(counter.0.borrow().len(), 2);
        // Without host state the limit is not enforced.
        for _ in 0..5 {
            assert_eq!(
                p.check(&req("/v1/completions", &alice), None),
                Decision::Allow(Some("alice".into()))
            );
        }
    }

    #[test]
    fn rate_limit_anonymous_per_client_ip_and_off_when_zero() {
        let counter = FakeCounter::default();
        let p = policy(&[("max-requests-per-minute", "1")]);
        let hs = h(&[]);
        let from = |addr| Request {
            remote_addr: addr,
            ..req("/v1/models", &hs)
        };
        assert_eq!(
            p.check(&from("10.0.0.1:1000"), Some(&counter)),
            Decision::Allow(None)
        );
        // Same IP, other port: same bucket.
        assert_eq!(
            denial(p.check(&from("10.0.0.1:2000"), Some(&counter))).status,
            429
        );
        assert_eq!(
            p.check(&from("[::1]:2000"), Some(&counter)),
            Decision::Allow(None)
        );
        assert!(counter.0.borrow().contains_key("rpm:addr:::1"));

        let off = policy(&[("max-requests-per-minute", "0")]);
        for _ in 0..3 {
            assert_eq!(
                off.check(&from("10.0.0.9:1"), Some(&counter)),
                Decision::Allow(None)
            );
        }
        assert!(!counter.0.borrow().contains_key("rpm:addr:10.0.0.9"));
    }

    #[test]
    fn client_ip_forms() {
        assert_eq!(client_ip("127.0.0.1:50123"), "127.0.0.1");
        assert_eq!(client_ip("[::1]:80"), "::1");
        assert_eq!(client_ip("::1"), "::1");
        assert_eq!(client_ip("unix"), "unix");
    }

    #[test]
    fn candidate_count_is_bounded() {
        let many: Vec<(String, String)> = (0..10)
            .map(|i| ("x-api-key".to_string(), format!("k{i}")))
            .collect();
        assert_eq!(presented_keys(&many).len(), MAX_CANDIDATES);
        let p = policy(&[("api-key", "k9")]);
        assert_eq!(denial(p.check(&req("/x", &many), None)).status, 401);
    }

    #[test]
    fn debug_never_prints_secrets() {
        let p = policy(&[("api-key", "alice:sk-alice-secret")]);
        let s = format!("{p:?}");
        assert!(s.contains("alice") && !s.contains("sk-alice-secret"), "{s}");
    }
}
