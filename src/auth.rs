//! Pure pieces of authentication and rate limiting: the API key format, key hashing, tenant ids,
//! and a per-key token bucket. The HTTP middleware (`http::guard`) and the store use them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every API key starts with this.
pub const KEY_MARKER: &str = "lp";
/// Length of the public prefix that names a key in listings and logs.
pub const PREFIX_LEN: usize = 8;
/// Length of the secret part (alphanumeric: ~190 bits of entropy).
pub const SECRET_LEN: usize = 32;
/// Longest tenant id.
pub const MAX_TENANT_ID_LEN: usize = 64;

const PREFIX_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A freshly generated key: shown once, stored only as `hash`.
#[derive(Debug, Clone)]
pub struct GeneratedKey {
    /// `lp_<prefix>_<secret>`: what the caller sends as `Authorization: Bearer …`.
    pub plaintext: String,
    pub prefix: String,
    /// Hex SHA-256 of `plaintext`.
    pub hash: String,
}

fn random_string(alphabet: &[u8], len: usize) -> String {
    let mut rng = rand::rngs::OsRng;
    (0..len)
        .map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char)
        .collect()
}

/// A new random key `lp_<8 lowercase alphanumerics>_<32 alphanumerics>`.
pub fn generate_key() -> GeneratedKey {
    let prefix = random_string(PREFIX_ALPHABET, PREFIX_LEN);
    let secret = random_string(SECRET_ALPHABET, SECRET_LEN);
    let plaintext = format!("{KEY_MARKER}_{prefix}_{secret}");
    let hash = hash_key(&plaintext);
    GeneratedKey {
        plaintext,
        prefix,
        hash,
    }
}

/// Hex SHA-256 of a key. Keys are high-entropy random strings, so a fast hash is enough.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The public prefix of a well-formed key; `None` for anything that is not one.
pub fn parse_key(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(KEY_MARKER)?.strip_prefix('_')?;
    let (prefix, secret) = rest.split_once('_')?;
    let prefix_ok =
        prefix.len() == PREFIX_LEN && prefix.bytes().all(|b| PREFIX_ALPHABET.contains(&b));
    let secret_ok = secret.len() >= SECRET_LEN && secret.bytes().all(|b| b.is_ascii_alphanumeric());
    (prefix_ok && secret_ok).then_some(prefix)
}

/// Compares two hex digests in constant time.
pub fn hashes_match(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Compares a presented secret with the expected one in constant time (both are hashed first, so
/// neither content nor length leaks through timing).
pub fn secrets_match(presented: &str, expected: &str) -> bool {
    hashes_match(&hash_key(presented), &hash_key(expected))
}

/// The token of `Authorization: Bearer <token>`; `None` when the header is not of that form.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

/// Whether `id` is 1 to `max_len` characters of `[A-Za-z0-9._:-]`: the alphabet of every id a
/// caller chooses (tenants, threads), safe in paths and logs.
pub fn is_identifier(id: &str, max_len: usize) -> bool {
    !id.is_empty()
        && id.len() <= max_len
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A tenant id: 1–64 characters of `[A-Za-z0-9._:-]`.
pub fn check_tenant_id(id: &str) -> Result<(), String> {
    if is_identifier(id, MAX_TENANT_ID_LEN) {
        Ok(())
    } else {
        Err(format!(
            "a tenant id is 1 to {MAX_TENANT_ID_LEN} characters of [A-Za-z0-9._:-]"
        ))
    }
}

/// One token bucket: `tokens` refill at `rate` per second up to `burst`.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn full(burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token, or says how long until one is available.
    pub fn take(&mut self, now: Instant, rate: f64, burst: f64) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// Per-tenant token buckets. A `rate` of zero turns limiting off.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        RateLimiter {
            rate: rate_per_sec.max(0.0),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.rate > 0.0
    }

    /// Takes a token of `key`'s bucket at `now`; `Err(retry_after)` when it is empty.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        if !self.enabled() {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets
            .entry(key.to_owned())
            .or_insert_with(|| Bucket::full(self.burst, now));
        bucket.take(now, self.rate, self.burst)
    }
}

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_hash() {
        let key = generate_key();
        assert_eq!(parse_key(&key.plaintext), Some(key.prefix.as_str()));
        assert_eq!(key.hash, hash_key(&key.plaintext));
        assert_eq!(key.hash.len(), 64);
        assert!(!key.hash.contains(&key.plaintext));
        assert_ne!(generate_key().plaintext, key.plaintext);
    }

    #[test]
    fn malformed_keys_are_rejected() {
        let secret = "A".repeat(SECRET_LEN);
        assert!(parse_key(&format!("lp_abcd1234_{secret}")).is_some());
        assert!(parse_key(&format!("lp_abcd123_{secret}")).is_none());
        assert!(parse_key(&format!("lp_ABCD1234_{secret}")).is_none());
        assert!(parse_key("lp_abcd1234_short").is_none());
        assert!(parse_key(&format!("xx_abcd1234_{secret}")).is_none());
        assert!(parse_key(&format!("lp_abcd1234_{secret}!")).is_none());
        assert!(parse_key("").is_none());
    }

    #[test]
    fn bearer_headers_are_parsed() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer a b"), None);
    }

    #[test]
    fn comparisons_are_exact() {
        assert!(hashes_match(&hash_key("a"), &hash_key("a")));
        assert!(!hashes_match(&hash_key("a"), &hash_key("b")));
        assert!(!hashes_match("ab", "abc"));
        assert!(secrets_match("admin-secret", "admin-secret"));
        assert!(!secrets_match("admin-secret", "admin-secreT"));
    }

    #[test]
    fn tenant_ids_are_checked() {
        assert!(check_tenant_id("acme-prod").is_ok());
        assert!(check_tenant_id("").is_err());
        assert!(check_tenant_id("a b").is_err());
        assert!(check_tenant_id(&"x".repeat(65)).is_err());
    }

    #[test]
    fn buckets_allow_the_burst_then_refill_at_the_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::full(3.0, start);
        for _ in 0..3 {
            assert!(bucket.take(start, 2.0, 3.0).is_ok());
        }
        let wait = bucket.take(start, 2.0, 3.0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(bucket
            .take(start + Duration::from_millis(500), 2.0, 3.0)
            .is_ok());
        // Refill never exceeds the burst.
        let later = start + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(bucket.take(later, 2.0, 3.0).is_ok());
        }
        assert!(bucket.take(later, 2.0, 3.0).is_err());
    }

    #[test]
    fn limiter_keeps_one_bucket_per_key() {
        let limiter = RateLimiter::new(1.0, 2);
        let now = Instant::now();
        assert!(limiter.check("a", now).is_ok());
        assert!(limiter.check("a", now).is_ok());
        assert!(limiter.check("a", now).is_err());
        assert!(limiter.check("b", now).is_ok());
        let off = RateLimiter::new(0.0, 1);
        for _ in 0..10 {
            assert!(off.check("a", now).is_ok());
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
