//! Importing agent transcripts (JSON Lines) into threads: the one path behind `loupe import` on
//! the database and `POST /v1/threads/{thread_id}/import`.
//!
//! Lines are read as they come and appended in batches of at most [`BATCH_ENTRIES`] entries and
//! about [`BATCH_BYTES`] bytes (a batch always takes the line that reaches the bound); each batch
//! is one atomic append, so memory is bounded by a constant plus a small multiple of the largest
//! line, whatever the file's size, and a crash loses at most the batch in flight. Every entry is keyed by its uuid (derived for entries without one, see
//! [`transcript::read_line`]): before a batch is appended, the uuids the thread already holds are
//! skipped, so re-running an import continues where it stopped. A line that cannot be stored is
//! refused with its reason, and the import goes on. Sub-agent entries (`isSidechain`) go to a
//! thread of their own, created on first use with its parent in its metadata.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::history::model::Entry;
use crate::history::transcript;
use crate::store::{fingerprint, AppendRequest, NewThread, Store, StoreError, TenantId};

/// Most entries appended per atomic batch.
pub const BATCH_ENTRIES: usize = 500;
/// Bytes of lines after which a batch is appended: a few large lines are appended one at a time
/// rather than held by the hundred.
pub const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Refusals listed one by one in a report; the rest are only counted.
pub const MAX_LISTED_REFUSALS: usize = 100;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImportReport {
    /// Non-blank lines read.
    pub lines: u64,
    /// Entries stored by this import.
    pub stored: u64,
    /// Entries the threads already held with the same content (a re-run): skipped.
    pub already_stored: u64,
    /// Lines refused.
    pub refused: u64,
    /// The first refusals (at most 100), each with its line and reason.
    pub refusals: Vec<Refusal>,
    /// The uuid of the last entry read (given or derived): pass it as `previous_uuid` to import
    /// the rest of the same file in another request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_uuid: Option<String>,
    /// The sub-agent threads that received entries.
    pub sidechain_threads: Vec<String>,
}

/// A line that was not stored, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Refusal {
    /// 1-based line number in the import (in the request, for an HTTP import).
    pub line: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub reason: String,
}

impl ImportReport {
    fn refuse(&mut self, line: u64, uuid: Option<String>, reason: String) {
        self.refused += 1;
        if self.refusals.len() < MAX_LISTED_REFUSALS {
            self.refusals.push(Refusal { line, uuid, reason });
        }
    }

    /// Adds the counts of a later part of the same import.
    pub fn absorb(&mut self, other: ImportReport) {
        self.lines += other.lines;
        self.stored += other.stored;
        self.already_stored += other.already_stored;
        self.refused += other.refused;
        let room = MAX_LISTED_REFUSALS.saturating_sub(self.refusals.len());
        self.refusals.extend(other.refusals.into_iter().take(room));
        if other.last_uuid.is_some() {
            self.last_uuid = other.last_uuid;
        }
        for thread in other.sidechain_threads {
            if !self.sidechain_threads.contains(&thread) {
                self.sidechain_threads.push(thread);
            }
        }
    }
}

/// An entry waiting for its batch, with the line it came from.
struct Pending {
    line: u64,
    entry: Entry,
    fingerprint: String,
}

/// Streams lines into a thread (and its sub-agent threads).
pub struct Importer {
    store: Store,
    tenant: TenantId,
    thread_id: String,
    /// Target thread → its pending entries, in line order.
    pending: BTreeMap<String, Vec<Pending>>,
    pending_count: usize,
    /// Bytes of the lines pending.
    pending_bytes: usize,
    /// Uuids pending per target thread, with their fingerprints (a repeated line is caught here).
    pending_uuids: HashMap<String, HashMap<String, String>>,
    known_sidechains: HashSet<String>,
    previous_uuid: String,
    report: ImportReport,
}

impl Importer {
    /// An import into `thread_id`, which must exist. `previous_uuid` continues the uuid chain of
    /// an earlier part of the same file (empty for a file's start).
    pub fn new(store: Store, tenant: TenantId, thread_id: String, previous_uuid: String) -> Self {
        Importer {
            store,
            tenant,
            thread_id,
            pending: BTreeMap::new(),
            pending_count: 0,
            pending_bytes: 0,
            pending_uuids: HashMap::new(),
            known_sidechains: HashSet::new(),
            previous_uuid,
            report: ImportReport::default(),
        }
    }

    /// The counts so far (for a progress display).
    pub fn report(&self) -> &ImportReport {
        &self.report
    }

    /// Reads one line (without its line break); blank lines are skipped. Appends a batch when
    /// enough entries are pending. Errs only when the database fails.
    pub async fn push_line(&mut self, line: &str) -> Result<(), StoreError> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            return Ok(());
        }
        self.report.lines += 1;
        let number = self.report.lines;
        let mut entry = match transcript::read_line(line, &self.previous_uuid) {
            Ok(entry) => entry,
            Err(error) => {
                self.report.refuse(number, None, error.reason);
                return Ok(());
            }
        };
        entry.seq = None;
        let uuid = entry.uuid.clone().unwrap_or_default();
        self.previous_uuid.clone_from(&uuid);
        self.report.last_uuid = Some(uuid.clone());
        let target = match transcript::sidechain_agent(&entry) {
            None => self.thread_id.clone(),
            Some(agent) => {
                let thread = transcript::sidechain_thread_id(&self.thread_id, &agent);
                if let Err(error) = self.ensure_sidechain(&thread, &agent).await {
                    match error {
                        StoreError::Database(_) => return Err(error),
                        other => {
                            self.report.refuse(number, Some(uuid), other.to_string());
                            return Ok(());
                        }
                    }
                }
                thread
            }
        };
        let fingerprint = fingerprint(&entry)?;
        let seen = self.pending_uuids.entry(target.clone()).or_default();
        if let Some(previous) = seen.get(&uuid) {
            if *previous == fingerprint {
                self.report.already_stored += 1;
            } else {
                let reason = "the uuid appears earlier in the import with other content".to_owned();
                self.report.refuse(number, Some(uuid), reason);
            }
            return Ok(());
        }
        seen.insert(uuid, fingerprint.clone());
        self.pending.entry(target).or_default().push(Pending {
            line: number,
            entry,
            fingerprint,
        });
        self.pending_count += 1;
        self.pending_bytes += line.len();
        if self.pending_count >= BATCH_ENTRIES || self.pending_bytes >= BATCH_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    /// Appends what is pending and answers the report.
    pub async fn finish(mut self) -> Result<ImportReport, StoreError> {
        self.flush().await?;
        Ok(self.report)
    }

    async fn ensure_sidechain(&mut self, thread: &str, agent: &str) -> Result<(), StoreError> {
        if self.known_sidechains.contains(thread) {
            return Ok(());
        }
        let mut metadata = Map::new();
        metadata.insert(
            "parent_thread".to_owned(),
            Value::from(self.thread_id.as_str()),
        );
        metadata.insert("agent_id".to_owned(), Value::from(agent));
        metadata.insert("sidechain".to_owned(), Value::Bool(true));
        let new = NewThread {
            id: Some(thread.to_owned()),
            metadata,
        };
        match self.store.create_thread(&self.tenant, new).await {
            Ok(_) | Err(StoreError::ThreadExists(_)) => {}
            Err(error) => return Err(error),
        }
        self.known_sidechains.insert(thread.to_owned());
        self.report.sidechain_threads.push(thread.to_owned());
        Ok(())
    }

    /// One atomic append per target thread, of the entries it does not hold yet.
    async fn flush(&mut self) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_count = 0;
        self.pending_bytes = 0;
        self.pending_uuids.clear();
        for (thread, batch) in pending {
            self.append_new(&thread, batch).await?;
        }
        Ok(())
    }

    async fn append_new(&mut self, thread: &str, batch: Vec<Pending>) -> Result<(), StoreError> {
        let uuids: Vec<String> = batch.iter().filter_map(|p| p.entry.uuid.clone()).collect();
        let stored = self
            .store
            .stored_fingerprints(&self.tenant, thread, &uuids)
            .await?;
        let mut fresh = Vec::with_capacity(batch.len());
        for p in batch {
            let uuid = p.entry.uuid.clone().unwrap_or_default();
            match stored.get(&uuid) {
                Some((_, hash)) if *hash == p.fingerprint => self.report.already_stored += 1,
                Some((seq, _)) => self.report.refuse(
                    p.line,
                    Some(uuid),
                    format!("the uuid is already stored with other content (seq {seq})"),
                ),
                None => fresh.push(p),
            }
        }
        if fresh.is_empty() {
            return Ok(());
        }
        let count = fresh.len() as u64;
        let request = AppendRequest {
            entries: fresh.into_iter().map(|p| p.entry).collect(),
            expected_next_seq: None,
        };
        let outcome = self.store.append(&self.tenant, thread, request).await?;
        if outcome.replayed {
            // Another import of the same lines committed them between the read and the append.
            self.report.already_stored += count;
        } else {
            self.report.stored += count;
        }
        Ok(())
    }
}

/// Cuts a byte stream into lines, refusing any line longer than `max_line_bytes` without
/// holding it: memory stays bounded by the longest accepted line.
pub struct LineSplitter {
    buffer: Vec<u8>,
    max_line_bytes: usize,
    /// Inside a line that is already too long: its bytes are dropped up to the next line break.
    skipping: bool,
}

/// One piece of input: a line, or the place of a line that was too long.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Line(String),
    NotUtf8,
    TooLong,
}

impl LineSplitter {
    pub fn new(max_line_bytes: usize) -> Self {
        LineSplitter {
            buffer: Vec::new(),
            max_line_bytes,
            skipping: false,
        }
    }

    /// Feeds bytes; answers the pieces they complete.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<Piece> {
        let mut pieces = Vec::new();
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let (head, rest) = (&bytes[..end], &bytes[end + 1..]);
            if self.skipping || self.buffer.len() + head.len() > self.max_line_bytes {
                pieces.push(Piece::TooLong);
                self.buffer.clear();
                self.skipping = false;
            } else {
                self.buffer.extend_from_slice(head);
                pieces.push(Self::piece(std::mem::take(&mut self.buffer)));
            }
            bytes = rest;
        }
        if !self.skipping {
            if self.buffer.len() + bytes.len() > self.max_line_bytes {
                self.buffer.clear();
                self.skipping = true;
            } else {
                self.buffer.extend_from_slice(bytes);
            }
        }
        pieces
    }

    /// The last line, when the input does not end with a line break.
    pub fn finish(self) -> Option<Piece> {
        if self.skipping {
            Some(Piece::TooLong)
        } else if self.buffer.is_empty() {
            None
        } else {
            Some(Self::piece(self.buffer))
        }
    }

    fn piece(bytes: Vec<u8>) -> Piece {
        match String::from_utf8(bytes) {
            Ok(line) => Piece::Line(line),
            Err(_) => Piece::NotUtf8,
        }
    }
}

impl Importer {
    /// Takes one piece from a [`LineSplitter`].
    pub async fn push_piece(&mut self, piece: Piece) -> Result<(), StoreError> {
        match piece {
            Piece::Line(line) => self.push_line(&line).await,
            Piece::NotUtf8 => {
                self.report.lines += 1;
                let line = self.report.lines;
                self.report
                    .refuse(line, None, "the line is not valid UTF-8".to_owned());
                Ok(())
            }
            Piece::TooLong => {
                self.report.lines += 1;
                let line = self.report.lines;
                self.report
                    .refuse(line, None, "the line is longer than the limit".to_owned());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(pieces: Vec<Piece>) -> Vec<String> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Line(l) => l,
                Piece::NotUtf8 => "<utf8>".to_owned(),
                Piece::TooLong => "<long>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn lines_split_across_chunks_and_long_ones_are_refused_without_being_held() {
        let mut splitter = LineSplitter::new(5);
        assert_eq!(lines(splitter.feed(b"ab")), Vec::<String>::new());
        assert_eq!(lines(splitter.feed(b"c\nde\n123456")), ["abc", "de"]);
        assert!(splitter.buffer.is_empty());
        assert_eq!(
            lines(splitter.feed(b"789\nok\n\xff\n")),
            ["<long>", "ok", "<utf8>"]
        );
        assert_eq!(lines(splitter.feed(b"tail")), Vec::<String>::new());
        assert_eq!(splitter.finish(), Some(Piece::Line("tail".to_owned())));
    }
}
