//! The one condition of an expired thread, as SQL on its `threads` row: by its own policy, or
//! by its tenant's. `super::retention` writes the tenant's policy in (lists, search and the
//! sweep, which read the policy first); every statement that reaches one thread by its row reads
//! it in the same statement ([`unexpired`]). A leaf: it imports nothing of the store.

/// The one expiry condition: a thread with a policy of its own expires by it, any other by
/// `by_tenant` (its tenant's policy as SQL).
pub(super) fn expired_by(now: &str, prefix: &str, by_tenant: &str) -> String {
    format!(
        "(CASE WHEN {prefix}retention_own = 1 THEN \
         ({prefix}retention_idle_ms IS NOT NULL \
         AND {prefix}updated_at + {prefix}retention_idle_ms <= CAST({now} AS BIGINT)) \
         OR ({prefix}retention_age_ms IS NOT NULL \
         AND {prefix}created_at + {prefix}retention_age_ms <= CAST({now} AS BIGINT)) \
         ELSE {by_tenant} END)"
    )
}

/// ` AND NOT <expired>` for a statement that reaches one thread by its row (its `threads`
/// columns named with `prefix`, an alias or `threads` and a dot), at `now` (a parameter): what
/// every read and write of one thread adds, so an expired thread is not found, as a deleted one,
/// before the sweep deletes it. The tenant's policy is read in the same statement, by its
/// primary key (one index probe, no round trip; none at all for a thread with a policy of its
/// own), so a policy just changed applies at once in every process.
pub(crate) fn unexpired(prefix: &str, now: &str) -> String {
    format!(" AND NOT {}", expired(prefix, now))
}

/// [`unexpired`]'s condition itself: the thread is expired at `now`.
pub(crate) fn expired(prefix: &str, now: &str) -> String {
    let by_tenant = format!(
        "EXISTS (SELECT 1 FROM tenant_retention r WHERE r.tenant_id = {prefix}tenant_id \
         AND ((r.idle_ms IS NOT NULL AND {prefix}updated_at + r.idle_ms <= CAST({now} AS BIGINT)) \
         OR (r.age_ms IS NOT NULL AND {prefix}created_at + r.age_ms <= CAST({now} AS BIGINT))))"
    );
    expired_by(now, prefix, &by_tenant)
}
