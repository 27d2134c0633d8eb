//! Webhook delivery: the sender that drains the outbox (`store::webhooks`), signed as the
//! Standard Webhooks specification has it, and the address policy that keeps it off private
//! networks.
//!
//! A request carries `webhook-id` (the delivery's id, the same on every attempt: receivers
//! deduplicate by it), `webhook-timestamp` (Unix seconds of the attempt) and
//! `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` under the
//! endpoint's secret (`whsec_` and 32 random bytes in base64, the key being those bytes).
//!
//! An attempt that gets no 2xx within the timeout is retried with exponential backoff, at most
//! [`crate::store::MAX_DELIVERY_ATTEMPTS`] times, the endpoint waiting meanwhile (its deliveries
//! go in order). Redirects are not followed, and no proxy is used (a proxy would resolve names
//! past the address policy). A slow endpoint holds one of the sender's slots for at most the
//! timeout, one per endpoint, and a tenant at most a quarter of them: other tenants' deliveries
//! go on, and appends never wait for any of it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{AttemptOutcome, DueDelivery, Store, StoreError};

/// How the sender works.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Endpoints on loopback, private, link-local and other non-public addresses are refused
    /// unless this is set (`--webhooks-allow-private`).
    pub allow_private: bool,
    /// One attempt's whole time, connection included.
    pub timeout: Duration,
    /// Deliveries sent at once (to as many endpoints).
    pub concurrency: u32,
    /// First retry delay, doubled per failed attempt, capped at `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How often an idle sender looks at the outbox.
    pub poll_interval: Duration,
    /// How long ended deliveries stay visible (and replayable) before they are pruned; an
    /// endpoint keeps at most [`crate::store::MAX_ENDED_PER_ENDPOINT`] of them, the newest.
    pub keep_ended: Duration,
}

impl WebhookConfig {
    pub const DEFAULT: WebhookConfig = WebhookConfig {
        allow_private: false,
        timeout: Duration::from_secs(10),
        concurrency: 16,
        backoff_base: Duration::from_secs(5),
        backoff_max: Duration::from_secs(3_600),
        poll_interval: Duration::from_millis(500),
        keep_ended: Duration::from_secs(7 * 24 * 3_600),
    };

    /// The delay after failed attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: i64) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 20) as u32;
        self.backoff_base
            .saturating_mul(2u32.saturating_pow(exponent))
            .min(self.backoff_max)
    }

    /// A claim outlives one attempt, so a live sender never loses it mid-request.
    fn lease(&self) -> Duration {
        self.timeout + Duration::from_secs(5)
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig::DEFAULT
    }
}

/// A new endpoint secret: `whsec_` and 32 random bytes in base64.
pub fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The `webhook-signature` of `body` sent as delivery `id` at `timestamp` (Unix seconds).
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
        })
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// Whether the service may send to `ip` without the operator's leave: a public unicast
/// address. Loopback, private (RFC 1918, unique local), link-local, shared (CGNAT),
/// documentation, benchmarking, multicast, broadcast and unspecified addresses are not.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let segments = v6.segments();
            let octets = v6.octets();
            let embedded = |at: usize| {
                IpAddr::V4(std::net::Ipv4Addr::new(
                    octets[at],
                    octets[at + 1],
                    octets[at + 2],
                    octets[at + 3],
                ))
            };
            // Forms that carry an IPv4 address, which a gateway may reach: NAT64
            // (64:ff9b::/96) and 6to4 (2002::/16) are as public as the address they carry.
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return is_public(embedded(12));
            }
            if segments[0] == 0x2002 {
                return is_public(embedded(2));
            }
            let first = segments[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // IPv4-compatible (::/96, deprecated) and IPv4-translated (::ffff:0:0:0/96).
                || segments[..6] == [0; 6]
                || segments[..6] == [0, 0, 0, 0, 0xffff, 0]
                // Local-use NAT64 (64:ff9b:1::/48).
                || segments[..3] == [0x64, 0xff9b, 1]
                || (first & 0xfe00) == 0xfc00
                // Link-local (fe80::/10) and the deprecated site-local (fec0::/10).
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                || first == 0x2001 && segments[1] == 0x0db8)
        }
    }
}

/// Checks an endpoint's URL as written: `http` or `https`, a host, no credentials, and an
/// address literal only when public (or private addresses are allowed). Names are checked when
/// they are resolved, at every attempt.
pub fn check_url(url: &str, allow_private: bool) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("must be an http or https URL".to_owned());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("must not hold credentials".to_owned());
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| "must name a host".to_owned())?;
    if parsed.port() == Some(0) {
        return Err("must not name port 0".to_owned());
    }
    // The URL parser writes any IPv4 form (`0x7f.1`) as dotted decimal, and IPv6 in brackets.
    let literal = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let name = host.trim_end_matches('.');
    let local_name = name == "localhost" || name.ends_with(".localhost");
    if !allow_private && local_name {
        return Err(private_refusal());
    }
    if let Some(ip) = literal {
        if !allow_private && !is_public(ip) {
            return Err(private_refusal());
        }
    }
    Ok(parsed)
}

fn private_refusal() -> String {
    "names a loopback or private address, which this service does not send to \
     (an operator may allow them with --webhooks-allow-private)"
        .to_owned()
}

/// A failed attempt's `last_error` when the endpoint's name did not resolve, or resolved only to
/// addresses the policy refuses: one reason for both, so that a tenant cannot probe which
/// internal names exist. The server's log says which it was.
pub const ADDRESS_REFUSED: &str = "not sent: the address is not allowed or could not be reached";

/// Resolves endpoint names, keeping only the addresses the policy allows: checked at connection
/// time, so a name that later resolves to a private address (DNS rebinding) is not reached.
struct PolicyResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            // Either way the attempt fails with the same reason; only the log tells which.
            let found: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), 0)).await {
                Ok(found) => found
                    .filter(|address| allow_private || is_public(address.ip()))
                    .collect(),
                Err(error) => {
                    tracing::info!(
                        name = name.as_str(),
                        %error,
                        "a webhook endpoint's name does not resolve"
                    );
                    return Err(Box::new(AddressRefused) as _);
                }
            };
            if found.is_empty() {
                tracing::info!(
                    name = name.as_str(),
                    "a webhook endpoint's name resolves to no address the policy allows"
                );
                return Err(Box::new(AddressRefused) as _);
            }
            Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The resolver's refusal: a name that does not resolve, or resolves only to refused addresses.
#[derive(Debug)]
struct AddressRefused;

impl std::fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(ADDRESS_REFUSED)
    }
}

impl std::error::Error for AddressRefused {}

/// The HTTP client every attempt goes through.
pub fn client(config: &WebhookConfig) -> reqwest::Client {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(PolicyResolver {
            allow_private: config.allow_private,
        }))
        .redirect(reqwest::redirect::Policy::none())
        // A proxy (HTTP_PROXY in the environment) would resolve the names itself.
        .no_proxy()
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(5)))
        .user_agent(concat!("loupe-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("the webhook client's settings are valid")
}

/// The body of a delivery: the event's id, kind, time and data (ids and seqs, never content).
pub fn delivery_body(delivery: &DueDelivery) -> String {
    let data: serde_json::Value =
        serde_json::from_str(&delivery.data).unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "id": delivery_id(delivery.delivery_id),
        "type": delivery.kind,
        "timestamp": crate::store::millis_to_datetime(delivery.created_at_ms).to_rfc3339(),
        "data": data,
    })
    .to_string()
}

/// A delivery's id as receivers see it.
pub fn delivery_id(id: i64) -> String {
    format!("whd_{id}")
}

/// One attempt at one delivery.
async fn attempt(
    client: &reqwest::Client,
    config: &WebhookConfig,
    delivery: &DueDelivery,
    now_ms: i64,
) -> AttemptOutcome {
    if let Err(error) = check_url(&delivery.url, config.allow_private) {
        return AttemptOutcome::Refused { error };
    }
    let id = delivery_id(delivery.delivery_id);
    let body = delivery_body(delivery);
    let timestamp = now_ms / 1000;
    let signature = sign(&delivery.secret, &id, timestamp, &body);
    let sent = client
        .post(&delivery.url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    let retry_at_ms = now_ms + config.backoff(delivery.attempt).as_millis() as i64;
    // The answer's body is never read: an endpoint cannot make the sender hold what it sends.
    match sent {
        Ok(response) if response.status().is_success() => AttemptOutcome::Delivered {
            status: response.status().as_u16(),
        },
        Ok(response) => AttemptOutcome::Failed {
            status: Some(response.status().as_u16()),
            error: format!("answered {}", response.status()),
            retry_at_ms,
        },
        Err(error) => AttemptOutcome::Failed {
            status: None,
            error: failure_reason(&error),
            retry_at_ms,
        },
    }
}

/// What a failed attempt's `last_error` says, for the tenant to read: the whole chain of causes,
/// except when the resolver refused the name, whose one reason hides which refusal it was.
fn failure_reason(error: &reqwest::Error) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<AddressRefused>() {
            return ADDRESS_REFUSED.to_owned();
        }
        cause = error.source();
    }
    error_chain(error)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The share of the sender's slots one tenant may hold.
fn tenant_slots(config: &WebhookConfig) -> usize {
    (config.concurrency as usize / 4).max(1)
}

/// Claims what is due at `now_ms` (at most the sender's slots, a tenant at most its share), for
/// endpoints not in `busy` (tenant, count in flight).
async fn claim_due(
    store: &Store,
    config: &WebhookConfig,
    now_ms: i64,
    free: usize,
    busy: &mut std::collections::HashMap<String, usize>,
) -> Result<Vec<DueDelivery>, StoreError> {
    let mut claimed = Vec::new();
    if free == 0 {
        return Ok(claimed);
    }
    // More candidates than slots: some are skipped for their tenant's share.
    let candidates = store
        .endpoints_due(now_ms, (free as u32).saturating_mul(4))
        .await?;
    for (tenant, endpoint) in candidates {
        if claimed.len() >= free {
            break;
        }
        let held = busy.get(&tenant).copied().unwrap_or(0);
        if held >= tenant_slots(config) {
            continue;
        }
        let lease = config.lease().as_millis() as i64;
        if let Some(delivery) = store
            .claim_endpoint(&tenant, &endpoint, now_ms, lease)
            .await?
        {
            *busy.entry(tenant).or_default() += 1;
            claimed.push(delivery);
        }
    }
    Ok(claimed)
}

/// Sends one claimed delivery and records the outcome.
async fn send(
    store: &Store,
    client: &reqwest::Client,
    config: &WebhookConfig,
    delivery: DueDelivery,
    now_ms: i64,
) {
    let outcome = attempt(client, config, &delivery, now_ms).await;
    let ended = chrono::Utc::now().timestamp_millis().max(now_ms);
    if let Err(error) = store.finish_delivery(&delivery, &outcome, ended).await {
        tracing::warn!(%error, delivery = delivery.delivery_id, "cannot record a webhook attempt");
    }
    crate::metrics::webhook_attempt(matches!(outcome, AttemptOutcome::Delivered { .. }));
}

/// One round: claims what is due at `now_ms` and sends it, all at once, waiting for every
/// attempt; returns how many were attempted. Tests drive the sender with it, time injected.
pub async fn deliver_due(
    store: &Store,
    client: &reqwest::Client,
    config: &WebhookConfig,
    now_ms: i64,
) -> Result<usize, StoreError> {
    let mut busy = std::collections::HashMap::new();
    let due = claim_due(
        store,
        config,
        now_ms,
        config.concurrency as usize,
        &mut busy,
    )
    .await?;
    let count = due.len();
    futures_util::future::join_all(
        due.into_iter()
            .map(|delivery| send(store, client, config, delivery, now_ms)),
    )
    .await;
    Ok(count)
}

/// How often the sender prunes ended deliveries and bounds the backlogs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(60);

/// The sender: keeps its slots busy with what is due until `stop` (a slot freed is filled at
/// once, never at the pace of the slowest attempt), dropping endpoints' backlogs past their
/// bound and pruning ended deliveries now and then.
pub fn spawn_sender(
    store: Store,
    config: WebhookConfig,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let client = client(&config);
        let mut running: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        // Which tenant each attempt in flight is for, by task: given back however it ends.
        let mut tenants: std::collections::HashMap<tokio::task::Id, String> =
            std::collections::HashMap::new();
        let mut busy: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut last_housekeeping = std::time::Instant::now() - HOUSEKEEPING_EVERY;
        while !stop.is_cancelled() {
            let now_ms = chrono::Utc::now().timestamp_millis();
            // Every minute, so what an endpoint holds past its bounds is at most a minute's
            // worth of deliveries.
            if last_housekeeping.elapsed() >= HOUSEKEEPING_EVERY {
                last_housekeeping = std::time::Instant::now();
                match store.drop_backlogs().await {
                    Ok(0) => {}
                    Ok(dropped) => tracing::warn!(
                        dropped,
                        "dropped webhook deliveries of endpoints too far behind"
                    ),
                    Err(error) => tracing::warn!(%error, "cannot bound the webhook backlogs"),
                }
                // After the drops: those count among the ended deliveries bounded here.
                let before = now_ms - config.keep_ended.as_millis() as i64;
                if let Err(error) = store.prune_deliveries(before).await {
                    tracing::warn!(%error, "cannot prune ended webhook deliveries");
                }
            }
            let free = config.concurrency as usize - running.len().min(config.concurrency as usize);
            let claimed = match claim_due(&store, &config, now_ms, free, &mut busy).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the webhook outbox");
                    Vec::new()
                }
            };
            let idle = claimed.is_empty();
            for delivery in claimed {
                let tenant = delivery.tenant_id.clone();
                let (store, client, config) = (store.clone(), client.clone(), config.clone());
                let task = running.spawn(async move {
                    send(&store, &client, &config, delivery, now_ms).await;
                });
                tenants.insert(task.id(), tenant);
            }
            let wait = if idle {
                config.poll_interval
            } else {
                Duration::ZERO
            };
            tokio::select! {
                _ = stop.cancelled() => {}
                Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                    let task = match done {
                        Ok((task, ())) => task,
                        Err(error) => error.id(),
                    };
                    if let Some(tenant) = tenants.remove(&task) {
                        if let Some(held) = busy.get_mut(&tenant) {
                            *held = held.saturating_sub(1);
                            if *held == 0 {
                                busy.remove(&tenant);
                            }
                        }
                    }
                }
                _ = tokio::time::sleep(wait), if running.len() < config.concurrency as usize => {}
            }
        }
        // In flight at the stop: each ends within its timeout, or its claim runs out and the
        // delivery is sent again by whoever claims the endpoint next.
        running.abort_all();
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(address: &str) -> bool {
        is_public(address.parse().unwrap())
    }

    #[test]
    fn addresses_that_reach_a_private_network_are_not_public() {
        for address in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            // IPv4-compatible and IPv4-translated forms of loopback and the metadata address.
            "::127.0.0.1",
            "::a9fe:a9fe",
            "::ffff:0:7f00:1",
            // NAT64 and 6to4 carrying private addresses, and local-use NAT64.
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "64:ff9b:1::1",
            "2001:db8::1",
        ] {
            assert!(!public(address), "{address} passed as public");
        }
    }

    #[test]
    fn public_addresses_and_the_public_ones_they_carry_are_public() {
        for address in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700:4700::1111",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
        ] {
            assert!(public(address), "{address} refused");
        }
    }

    #[test]
    fn urls_are_checked_as_written() {
        for url in [
            "http://localhost/x",
            "http://LOCALHOST./x",
            "http://0x7f.1/x",
            "http://[::ffff:7f00:1]/x",
            "https://example.com:0/x",
            "https://u:p@example.com/x",
            "file:///etc/passwd",
        ] {
            assert!(check_url(url, false).is_err(), "{url} accepted");
        }
        assert!(check_url("https://example.com/x", false).is_ok());
        assert!(check_url("http://127.0.0.1:9/x", true).is_ok());
    }

    /// A name that does not resolve and one that resolves to a loopback address fail alike: a
    /// tenant cannot learn from `last_error` which internal names exist.
    #[tokio::test]
    async fn a_name_unresolved_and_one_resolved_to_a_private_address_fail_alike() {
        let client = client(&WebhookConfig::DEFAULT);
        let mut reasons = Vec::new();
        // `localhost` is refused as written before any attempt; its resolver is tried here.
        for url in [
            "http://localhost:9/hook",
            "http://no-such-host.invalid/hook",
        ] {
            let error = client.post(url).send().await.expect_err("not reached");
            reasons.push(failure_reason(&error));
        }
        assert_eq!(reasons[0], reasons[1]);
        assert!(reasons[0].contains(ADDRESS_REFUSED), "{}", reasons[0]);
    }

    /// Standard Webhooks' example: this secret, id, timestamp and body sign as shown.
    #[test]
    fn signatures_follow_the_standard() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
