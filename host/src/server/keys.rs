//! API keys as the bundled policy guest reads them (`secret` or
//! `id:secret`), checked before the server starts: a key that is empty or
//! whitespace, or two keys with the same caller id (which would share one
//! prefix cache and one rate-limit counter), refuse the start.

use sha2::{Digest, Sha256};

/// `id` of `id:secret`: `[A-Za-z0-9._@-]{1,64}`.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

/// (explicit id, secret) of a configured key: `id:secret` when the id is
/// valid and the secret is not empty, else the whole value is the secret.
fn split(value: &str) -> (Option<&str>, &str) {
    let value = value.trim();
    match value.split_once(':') {
        Some((id, secret)) if valid_id(id) && !secret.is_empty() => (Some(id), secret),
        _ => (None, value),
    }
}

/// The secret part of a configured key.
pub fn key_secret(value: &str) -> &str {
    split(value).1
}

/// The caller id the policy gives a key: its explicit id, else `key-` and
/// the first 8 hex digits of the secret's SHA-256.
pub fn key_id(value: &str) -> String {
    match split(value) {
        (Some(id), _) => id.to_string(),
        (None, secret) => {
            let d = Sha256::digest(secret.as_bytes());
            format!("key-{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
        }
    }
}

/// Refuses empty or whitespace keys, secrets with whitespace or control
/// characters, and two keys with one caller id.
pub fn validate(keys: &[String]) -> Result<(), String> {
    let mut ids: Vec<(String, usize)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let n = i + 1;
        let secret = key_secret(k);
        if secret.is_empty() {
            return Err(format!(
                "API key #{n} is empty or only whitespace: pass a real key (--api-key KEY or QWASI_API_KEY)"
            ));
        }
        if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "API key #{n} contains whitespace or control characters"
            ));
        }
        let id = key_id(k);
        if let Some((_, m)) = ids.iter().find(|(other, _)| *other == id) {
            return Err(format!(
                "API keys #{m} and #{n} have the same caller id {id:?} (an explicit id equal to another key's \
                 derived id, or a repeated id): they would share a prefix cache and a rate limit; give each key \
                 its own id (id:secret)"
            ));
        }
        ids.push((id, n));
    }
    Ok(())
}

/// Compares two byte strings in time independent of where they differ.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let (x, y) = (Sha256::digest(a), Sha256::digest(b));
    x.iter()
        .zip(y.iter())
        .fold(0u8, |acc, (p, q)| acc | (p ^ q))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(keys: &[&str]) -> Result<(), String> {
        validate(&keys.iter().map(|k| k.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn secrets_and_ids() {
        assert_eq!(key_secret("ops:sk-1"), "sk-1");
        assert_eq!(key_secret("sk-plain"), "sk-plain");
        assert_eq!(key_secret("bad id:x"), "bad id:x");
        assert_eq!(key_id("ops:sk-1"), "ops");
        let derived = key_id("sk-plain");
        assert!(
            derived.starts_with("key-") && derived.len() == 12,
            "{derived}"
        );
    }

    #[test]
    fn refuses_blank_keys_and_shared_ids() {
        assert!(v(&["sk-1", "ops:sk-2"]).is_ok());
        assert!(v(&[" "]).unwrap_err().contains("empty or only whitespace"));
        assert!(v(&[""]).unwrap_err().contains("empty"));
        assert!(v(&["sk 1"]).unwrap_err().contains("whitespace"));
        let derived = key_id("sk-plain");
        let e = v(&["sk-plain", &format!("{derived}:sk-other")]).unwrap_err();
        assert!(e.contains("same caller id"), "{e}");
        assert!(
            v(&["a:sk-1", "a:sk-2"])
                .unwrap_err()
                .contains("same caller id")
        );
    }
}
