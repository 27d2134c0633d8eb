//! Per-thread settings: the auto-compaction threshold, micro-compaction and clearing of the
//! context view, outline mode.

use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{now_millis, Store, StoreError, TenantId, ThreadId};
use crate::history::normalize::ClearingOptions;
use crate::history::MicrocompactOptions;
use crate::tree::OutlineOptions;

/// A thread's stored settings; `None` means "the server default".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadSettings {
    /// Auto-compaction threshold in estimated context tokens (0 = off for this thread).
    pub auto_compact_tokens: Option<i64>,
    pub microcompact: Option<MicrocompactSettings>,
    /// Outline mode and its budgets (see [`crate::tree::policy`]).
    pub outline: Option<OutlineOptions>,
    /// Reversible clearing of old tool results in the context view.
    pub clearing: Option<ClearingSettings>,
}

/// Reversible clearing of old tool results in the context view (never in storage). Unset fields
/// take the defaults of [`crate::history::normalize::ClearingOptions`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearingSettings {
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bytes: Option<u64>,
}

impl ClearingSettings {
    /// The stored values with the defaults filled in (whether or not it is on).
    pub fn options(&self) -> ClearingOptions {
        let defaults = ClearingOptions::default();
        ClearingOptions {
            keep_tokens: self.keep_tokens.unwrap_or(defaults.keep_tokens),
            batch_tokens: self.batch_tokens.unwrap_or(defaults.batch_tokens),
            min_bytes: self.min_bytes.map_or(defaults.min_bytes, |n| n as usize),
        }
    }
}

/// Micro-compaction of old tool results in the context view (never in storage). Unset fields take
/// the defaults of [`crate::history::MicrocompactOptions`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MicrocompactSettings {
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_recent: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_bytes: Option<u64>,
}

impl ThreadSettings {
    /// The clearing options of the thread's context: `None` when it is off.
    pub fn clearing_options(&self) -> Option<ClearingOptions> {
        self.clearing
            .as_ref()
            .filter(|c| c.enabled)
            .map(ClearingSettings::options)
    }

    /// The micro-compaction options of the thread's context: `None` when it is off, else the
    /// stored values with the defaults filled in.
    pub fn microcompact_options(&self) -> Option<MicrocompactOptions> {
        let stored = self.microcompact.as_ref().filter(|m| m.enabled)?;
        let defaults = MicrocompactOptions::default();
        Some(MicrocompactOptions {
            tools: stored.tools.clone().unwrap_or(defaults.tools),
            keep_recent: stored
                .keep_recent
                .map_or(defaults.keep_recent, |n| n as usize),
            min_bytes: stored.min_bytes.map_or(defaults.min_bytes, |n| n as usize),
        })
    }
}

/// A settings part as its JSON column (`None`: NULL, the server default).
fn json_column<T: Serialize>(part: Option<&T>) -> Result<Option<String>, StoreError> {
    part.map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The `outline` column: the thread's outline options, `None` when never set.
pub(super) fn outline_column(json: Option<String>) -> Result<Option<OutlineOptions>, StoreError> {
    json.map(|json| serde_json::from_str(&json))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("outline settings: {e}")))
}

/// The `clearing` column: the thread's clearing options when it is on.
pub(super) fn clearing_column(json: Option<String>) -> Result<Option<ClearingOptions>, StoreError> {
    let settings: Option<ClearingSettings> = json
        .map(|json| serde_json::from_str(&json))
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("clearing settings: {e}")))?;
    Ok(settings.filter(|c| c.enabled).map(|c| c.options()))
}

/// The settings of a row holding the `thread_settings` columns (NULLs: the defaults).
pub(super) fn settings_from_row(row: &sqlx::any::AnyRow) -> Result<ThreadSettings, StoreError> {
    let microcompact: Option<String> = row.try_get("microcompact")?;
    let outline: Option<String> = row.try_get("outline")?;
    let clearing: Option<String> = row.try_get("clearing")?;
    Ok(ThreadSettings {
        clearing: clearing
            .map(|json| serde_json::from_str(&json))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("clearing settings: {e}")))?,
        outline: outline_column(outline)?,
        auto_compact_tokens: row.try_get("auto_compact_tokens")?,
        microcompact: microcompact
            .map(|json| serde_json::from_str(&json))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("microcompact settings: {e}")))?,
    })
}

impl Store {
    /// The thread's settings (all defaults when none were stored): those of its
    /// [`Store::context_head`], one statement.
    pub async fn thread_settings(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
    ) -> Result<ThreadSettings, StoreError> {
        Ok(self.context_head(tenant, thread_id).await?.settings)
    }

    /// Replaces the thread's settings.
    pub async fn put_thread_settings(
        &self,
        tenant: &TenantId,
        thread_id: &ThreadId,
        settings: &ThreadSettings,
    ) -> Result<(), StoreError> {
        let microcompact = json_column(settings.microcompact.as_ref())?;
        let outline = json_column(settings.outline.as_ref())?;
        let clearing = json_column(settings.clearing.as_ref())?;
        let mut tx = self.writer.begin().await?;
        let thread_key = Store::thread_key_in(&mut tx, tenant, thread_id).await?;
        sqlx::query(
            "INSERT INTO thread_settings (thread_key, auto_compact_tokens, microcompact, outline, \
             clearing, updated_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (thread_key) DO \
             UPDATE SET auto_compact_tokens = excluded.auto_compact_tokens, \
             microcompact = excluded.microcompact, outline = excluded.outline, \
             clearing = excluded.clearing, updated_at = excluded.updated_at",
        )
        .bind(thread_key.as_str())
        .bind(settings.auto_compact_tokens)
        .bind(microcompact)
        .bind(outline)
        .bind(clearing)
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        // Turning the outline on builds the tree of what is already stored.
        let job = if settings.outline.is_some_and(|o| o.enabled) {
            Some(
                super::jobs::enqueue_tree_in(
                    &mut tx,
                    self.backend,
                    tenant,
                    &thread_key,
                    self.job_max_attempts,
                )
                .await?,
            )
        } else {
            None
        };
        tx.commit().await?;
        if job.is_some_and(|outcome| outcome.created) {
            self.job_signal.notify_one();
        }
        self.recount_context_tokens(tenant, thread_id, super::append::Recount::Settings)
            .await
    }
}
