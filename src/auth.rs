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
        self.peek(now, rate, burst)?;
        self.tokens -= 1.0;
        Ok(())
    }

    /// Whether a token is available, without taking it.
    pub fn peek(&mut self, now: Instant, rate: f64, burst: f64) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
        if self.tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }

    fn is_full(&self, now: Instant, rate: f64, burst: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * rate >= burst
    }
}

/// Failed authentications, per peer address, and keys known not to be valid.
///
/// A peer that failed too often is refused before any key is looked up, and a key that was just
/// looked up and not found is refused again without a lookup for [`AuthFailures::REMEMBERED`]:
/// a stream of bogus keys costs neither the database nor the other tenants anything.
#[derive(Debug)]
pub struct AuthFailures {
    rate: f64,
    burst: f64,
    peers: Mutex<HashMap<String, Bucket>>,
    /// Hex SHA-256 of keys that failed → when that was found out.
    unknown_keys: Mutex<HashMap<String, Instant>>,
}

impl AuthFailures {
    /// How long a key found not valid is refused without a lookup.
    pub const REMEMBERED: Duration = Duration::from_secs(10);
    /// Most peers and keys remembered: past it, the forgotten are those with nothing to remember.
    const MAX_REMEMBERED: usize = 10_000;

    /// `rate` failures per second per peer on average, `burst` at once; a rate of 0 is no limit.
    pub fn new(rate_per_sec: f64, burst: u32) -> Self {
        AuthFailures {
            rate: rate_per_sec.max(0.0),
            burst: f64::from(burst.max(1)),
            peers: Mutex::new(HashMap::new()),
            unknown_keys: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after)` when `peer` has failed more than its share.
    pub fn check_peer(&self, peer: &str, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get_mut(peer) {
            Some(bucket) => bucket.peek(now, self.rate, self.burst),
            None => Ok(()),
        }
    }

    /// Counts a failure of `peer`, and remembers `key_hash` as not valid.
    pub fn record(&self, peer: Option<&str>, key_hash: Option<&str>, now: Instant) {
        if let (Some(peer), true) = (peer, self.rate > 0.0) {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            if peers.len() >= Self::MAX_REMEMBERED && !peers.contains_key(peer) {
                let (rate, burst) = (self.rate, self.burst);
                peers.retain(|_, bucket| !bucket.is_full(now, rate, burst));
            }
            if peers.len() < Self::MAX_REMEMBERED || peers.contains_key(peer) {
                let bucket = peers
                    .entry(peer.to_owned())
                    .or_insert_with(|| Bucket::full(self.burst, now));
                let _ = bucket.take(now, self.rate, self.burst);
            }
        }
        if let Some(hash) = key_hash {
            let mut keys = self.unknown_keys.lock().unwrap_or_else(|e| e.into_inner());
            if keys.len() >= Self::MAX_REMEMBERED {
                keys.retain(|_, at| now.saturating_duration_since(*at) < Self::REMEMBERED);
            }
            if keys.len() < Self::MAX_REMEMBERED {
                keys.insert(hash.to_owned(), now);
            }
        }
    }

    /// Whether `key_hash` failed within [`AuthFailures::REMEMBERED`].
    pub fn known_unknown(&self, key_hash: &str, now: Instant) -> bool {
        let keys = self.unknown_keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.get(key_hash)
            .is_some_and(|at| now.saturating_duration_since(*at) < Self::REMEMBERED)
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
    fn a_peer_that_fails_past_its_burst_is_refused_until_it_refills() {
        let failures = AuthFailures::new(1.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(failures.check_peer("10.0.0.1", t0).is_ok());
            failures.record(Some("10.0.0.1"), None, t0);
        }
        let wait = failures.check_peer("10.0.0.1", t0).unwrap_err();
        assert!(wait <= Duration::from_secs(1));
        assert!(
            failures.check_peer("10.0.0.2", t0).is_ok(),
            "other peers are not affected"
        );
        assert!(failures
            .check_peer("10.0.0.1", t0 + Duration::from_secs(1))
            .is_ok());
        assert!(AuthFailures::new(0.0, 1).check_peer("p", t0).is_ok());
    }

    #[test]
    fn an_unknown_key_is_remembered_briefly() {
        let failures = AuthFailures::new(1.0, 3);
        let t0 = Instant::now();
        failures.record(None, Some("h"), t0);
        assert!(failures.known_unknown("h", t0 + Duration::from_secs(1)));
        assert!(!failures.known_unknown("h", t0 + AuthFailures::REMEMBERED));
        assert!(!failures.known_unknown("other", t0));
    }

    #[test]
    fn remembered_peers_stay_bounded() {
        let failures = AuthFailures::new(1.0, 2);
        let t0 = Instant::now();
        for i in 0..(AuthFailures::MAX_REMEMBERED + 50) {
            failures.record(Some(&format!("peer-{i}")), None, t0);
        }
        let later = t0 + Duration::from_secs(5);
        failures.record(Some("late"), None, later);
        let peers = failures.peers.lock().unwrap().len();
        assert!(peers <= AuthFailures::MAX_REMEMBERED, "{peers}");
    }

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
