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
use crate::json_weight::{is_json_space, ByteIn, StringScan};
use crate::store::{fingerprint, AppendRequest, NewThread, Store, StoreError, TenantId, ThreadId};

/// Most entries appended per atomic batch.
pub const BATCH_ENTRIES: usize = 500;
/// Bytes of lines after which a batch is appended: a few large lines are appended one at a time
/// rather than held by the hundred.
pub const BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Refusals listed one by one in a report; the rest are only counted.
pub const MAX_LISTED_REFUSALS: usize = 100;
/// Sub-agent threads listed by name in a report; the rest are only counted.
pub const MAX_LISTED_SIDECHAINS: usize = 100;
/// Bytes of a refusal's reason or uuid kept in a report. A parser's message can quote the whole
/// refused item, and the report must not grow with what it refuses.
pub const REFUSAL_TEXT_BYTES: usize = 300;
/// Times a batch is planned again when a concurrent import of the same entries stored some of
/// them first (each retry reads what is stored now, so it only fails again if the race repeats).
const APPEND_RETRIES: usize = 3;

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
    /// The sub-agent threads that received entries (the first 100).
    pub sidechain_threads: Vec<String>,
    /// How many sub-agent threads received entries (`sidechain_threads` lists at most 100).
    #[serde(default)]
    pub sidechain_thread_count: u64,
    /// The write's consistency token (also the `Loupe-LSN` header): send it back with a read
    /// (`Loupe-LSN` or `min_lsn`) to see this write on a read standby. Present only where the
    /// service reads from standbys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        example = "0/3000148"
    )]
    pub lsn: Option<String>,
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
            self.refusals.push(Refusal {
                line,
                uuid: uuid.map(|uuid| bounded(&uuid)),
                reason: bounded(&reason),
            });
        }
    }

    fn add_sidechain(&mut self, thread: &str) {
        self.sidechain_thread_count += 1;
        if self.sidechain_threads.len() < MAX_LISTED_SIDECHAINS {
            self.sidechain_threads.push(thread.to_owned());
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
        // A sub-agent thread can receive entries in several parts: one listed already is not
        // counted again (those past the listed hundred cannot be told apart, and are).
        let unlisted = other.sidechain_thread_count - other.sidechain_threads.len() as u64;
        self.sidechain_thread_count += unlisted;
        for thread in other.sidechain_threads {
            if !self.sidechain_threads.contains(&thread) {
                self.sidechain_thread_count += 1;
                if self.sidechain_threads.len() < MAX_LISTED_SIDECHAINS {
                    self.sidechain_threads.push(thread);
                }
            }
        }
    }
}

/// `text` cut to [`REFUSAL_TEXT_BYTES`] on a character boundary, marked with `…` when cut.
fn bounded(text: &str) -> String {
    if text.len() <= REFUSAL_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = REFUSAL_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    thread_id: ThreadId,
    /// Target thread → its pending entries, in line order.
    pending: BTreeMap<ThreadId, Vec<Pending>>,
    pending_count: usize,
    /// Bytes of the lines pending.
    pending_bytes: usize,
    /// Uuids pending per target thread, with their fingerprints (a repeated line is caught here).
    pending_uuids: HashMap<ThreadId, HashMap<String, String>>,
    known_sidechains: HashSet<ThreadId>,
    previous_uuid: String,
    report: ImportReport,
    /// What one piece of the input is called in refusals: a `line`, or an `entry` of an array.
    unit: &'static str,
    /// Most memory one line may take once parsed (`json_weight`).
    max_parsed_bytes: usize,
}

impl Importer {
    /// An import into `thread_id`, which must exist. `previous_uuid` continues the uuid chain of
    /// an earlier part of the same file (empty for a file's start).
    pub fn new(store: Store, tenant: TenantId, thread_id: ThreadId, previous_uuid: String) -> Self {
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
            unit: "line",
            max_parsed_bytes: crate::json_weight::DEFAULT_MAX_PARSED_BYTES,
        }
    }

    /// The same import, each line refused when its parsed values would take more than `bytes`.
    pub fn with_max_parsed_bytes(mut self, bytes: usize) -> Self {
        self.max_parsed_bytes = bytes;
        self
    }

    /// The same import, its input the items of a JSON array ([`ArraySplitter`]) rather than
    /// lines: refusals call them entries (their `line` is the item's place in the array).
    pub fn of_array_items(mut self) -> Self {
        self.unit = "entry";
        self
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
        if let Err(heavy) = crate::json_weight::within(line.as_bytes(), self.max_parsed_bytes) {
            let reason = format!("the {} holds {heavy}", self.unit);
            self.report.refuse(number, None, reason);
            return Ok(());
        }
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
                let thread = ThreadId::new(transcript::sidechain_thread_id(
                    self.thread_id.as_str(),
                    &agent,
                ));
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

    async fn ensure_sidechain(&mut self, thread: &ThreadId, agent: &str) -> Result<(), StoreError> {
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
            id: Some(thread.clone()),
            metadata,
        };
        match self.store.create_thread(&self.tenant, new).await {
            Ok(_) | Err(StoreError::ThreadExists(_)) => {}
            Err(error) => return Err(error),
        }
        self.known_sidechains.insert(thread.clone());
        self.report.add_sidechain(thread.as_str());
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

    /// Appends the entries of `batch` the thread does not hold yet. A concurrent import of the
    /// same entries (a client retrying while its first import still runs) can store some of
    /// them between the read and the append: the batch is then planned again from what is
    /// stored, so they count as already stored rather than failing the import.
    async fn append_new(
        &mut self,
        thread: &ThreadId,
        batch: Vec<Pending>,
    ) -> Result<(), StoreError> {
        let (mut batch, mut retries) = (batch, 0);
        loop {
            let fresh = self.not_stored(thread, batch).await?;
            if fresh.is_empty() {
                return Ok(());
            }
            let count = fresh.len() as u64;
            let request = AppendRequest {
                entries: fresh.iter().map(|p| p.entry.clone()).collect(),
                expected_next_seq: None,
            };
            match self.store.append(&self.tenant, thread, request).await {
                Ok(outcome) => {
                    if outcome.replayed {
                        // The concurrent import committed exactly these entries first.
                        self.report.already_stored += count;
                    } else {
                        self.report.stored += count;
                    }
                    // Snips among them hide their messages' lines in the summary tree too.
                    crate::jobs::erasure::hide_snipped(
                        &self.store,
                        &self.tenant,
                        thread,
                        &outcome.messages,
                    )
                    .await?;
                }
                Err(StoreError::PartialReplay { .. } | StoreError::UuidConflict { .. })
                    if retries < APPEND_RETRIES =>
                {
                    retries += 1;
                    batch = fresh;
                    continue;
                }
                Err(error) => return Err(error),
            }
            return Ok(());
        }
    }

    /// The entries of `batch` the thread does not hold; those it holds are counted (same
    /// content) or refused (other content).
    async fn not_stored(
        &mut self,
        thread: &ThreadId,
        batch: Vec<Pending>,
    ) -> Result<Vec<Pending>, StoreError> {
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
        Ok(fresh)
    }
}

/// Cuts a byte stream into lines, refusing any line longer than `max_line_bytes` without
/// holding it: memory stays bounded by the longest accepted line.
pub struct LineSplitter {
    buffer: Vec<u8>,
    max_line_bytes: usize,
    /// Inside a line that is already too long: its bytes are dropped up to the next line break.
    skipping: bool,
    mark: ByteOrderMark,
}

/// Drops a UTF-8 byte-order mark (which some editors write) at the start of a body, however the
/// body is cut into chunks, so both import forms read such a file alike.
#[derive(Debug, Default)]
struct ByteOrderMark {
    /// Bytes of the mark matched so far.
    matched: usize,
    /// The body's start is behind: nothing more is dropped.
    done: bool,
}

impl ByteOrderMark {
    const BYTES: &'static [u8] = b"\xEF\xBB\xBF";

    /// Splits `chunk` into the bytes of a partial mark that turned out not to be one (to be read
    /// first) and the rest after any mark.
    fn strip<'a>(&mut self, chunk: &'a [u8]) -> (&'static [u8], &'a [u8]) {
        if self.done {
            return (&[], chunk);
        }
        for (index, &byte) in chunk.iter().enumerate() {
            if self.matched == Self::BYTES.len() {
                self.done = true;
                return (&[], &chunk[index..]);
            }
            if byte != Self::BYTES[self.matched] {
                self.done = true;
                return (&Self::BYTES[..self.matched], &chunk[index..]);
            }
            self.matched += 1;
        }
        self.done = self.matched == Self::BYTES.len();
        (&[], &[])
    }

    /// At the body's end: the bytes of a partial mark, which were not a mark after all.
    fn unfinished(&self) -> &'static [u8] {
        if self.done {
            &[]
        } else {
            &Self::BYTES[..self.matched]
        }
    }
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
            mark: ByteOrderMark::default(),
        }
    }

    /// Feeds bytes; answers the pieces they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Piece> {
        let (replay, rest) = self.mark.strip(bytes);
        let mut pieces = self.feed_unmarked(replay);
        pieces.extend(self.feed_unmarked(rest));
        pieces
    }

    fn feed_unmarked(&mut self, mut bytes: &[u8]) -> Vec<Piece> {
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
    pub fn finish(mut self) -> Option<Piece> {
        let partial_mark = self.mark.unfinished();
        self.feed_unmarked(partial_mark);
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

/// A file of either import form, told apart by its first byte (after a byte-order mark and
/// whitespace): `[` opens a JSON array, and anything else is JSON Lines, whose lines are objects.
pub enum FileSplitter {
    Lines(LineSplitter),
    Array(ArraySplitter),
}

impl FileSplitter {
    /// The splitter for a file whose first chunk is `start` (not yet fed).
    pub fn for_start(start: &[u8], max_piece_bytes: usize) -> Self {
        let start = start.strip_prefix(ByteOrderMark::BYTES).unwrap_or(start);
        match start.iter().find(|&&byte| !is_json_space(byte)) {
            Some(b'[') => FileSplitter::Array(ArraySplitter::new(max_piece_bytes)),
            _ => FileSplitter::Lines(LineSplitter::new(max_piece_bytes)),
        }
    }

    pub fn is_array(&self) -> bool {
        matches!(self, FileSplitter::Array(_))
    }

    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Piece>, MalformedArray> {
        match self {
            FileSplitter::Lines(lines) => Ok(lines.feed(bytes)),
            FileSplitter::Array(array) => array.feed(bytes),
        }
    }

    /// The end of the file: its last line, or whether the array closed.
    pub fn finish(self) -> Result<Option<Piece>, MalformedArray> {
        match self {
            FileSplitter::Lines(lines) => Ok(lines.finish()),
            FileSplitter::Array(array) => array.finish().map(|()| None),
        }
    }
}

/// Cuts a byte stream holding one JSON array into its items, as [`LineSplitter`] cuts lines:
/// each item's text is a piece, and an item longer than `max_item_bytes` is refused without
/// being held. Memory stays bounded by the longest accepted item, whatever the array's length.
///
/// The array's own syntax is checked as the bytes pass (the brackets, the commas between items,
/// nothing after the close) and each accepted item is checked to be well-formed JSON, so a body
/// that is not one JSON array is [`MalformedArray`]; whether an item is an entry is the
/// importer's to say, as for a line. An item keeps its bytes (an exported thread imports back
/// byte for byte), except that one spread over several lines loses the whitespace between its
/// tokens: a stored entry is one line, as an export in JSON Lines writes it.
pub struct ArraySplitter {
    buffer: Vec<u8>,
    max_item_bytes: usize,
    expect: Expect,
    /// Bytes of the body consumed before the current chunk (for the place of an error).
    offset: u64,
    /// Inside the current item: nesting of its brackets, and its strings.
    depth: usize,
    strings: StringScan,
    /// The current item spans a line break outside its strings.
    broken: bool,
    /// The current item is already too long: its bytes are dropped up to its end.
    skipping: bool,
    mark: ByteOrderMark,
}

/// Where an [`ArraySplitter`] is in the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// `[`, after optional whitespace.
    Open,
    /// The first item, or `]` for an empty array.
    FirstItem,
    /// An item, after a comma.
    Item,
    /// Inside an object, array or string item.
    InItem,
    /// Inside a scalar item (a number, `true`, `false`, `null`): it ends at whitespace, `,` or `]`.
    InScalar,
    /// `,` or `]` after an item.
    Separator,
    /// Nothing but whitespace after the closing `]`.
    Closed,
}

/// Why a body is not one JSON array.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the body is not a JSON array of entries: {reason} (at byte {offset})")]
pub struct MalformedArray {
    pub offset: u64,
    pub reason: String,
}

impl ArraySplitter {
    pub fn new(max_item_bytes: usize) -> Self {
        ArraySplitter {
            buffer: Vec::new(),
            max_item_bytes,
            expect: Expect::Open,
            offset: 0,
            depth: 0,
            strings: StringScan::default(),
            broken: false,
            skipping: false,
            mark: ByteOrderMark::default(),
        }
    }

    /// Feeds bytes; answers the items they complete, or where the body stops being an array.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Piece>, MalformedArray> {
        let before = bytes.len();
        let (replay, rest) = self.mark.strip(bytes);
        // A partial mark that is not one cannot open an array: reading it reports where.
        let mut pieces = self.feed_unmarked(replay)?;
        self.offset += (before - rest.len()) as u64;
        pieces.extend(self.feed_unmarked(rest)?);
        Ok(pieces)
    }

    fn feed_unmarked(&mut self, bytes: &[u8]) -> Result<Vec<Piece>, MalformedArray> {
        let mut pieces = Vec::new();
        // Where the current item's bytes in this chunk start.
        let mut start = 0;
        let mut index = 0;
        while index < bytes.len() {
            let byte = bytes[index];
            match self.expect {
                Expect::Open
                | Expect::FirstItem
                | Expect::Item
                | Expect::Separator
                | Expect::Closed
                    if is_json_space(byte) => {}
                Expect::Open if byte == b'[' => self.expect = Expect::FirstItem,
                Expect::Open => return Err(self.malformed(index, "it does not start with `[`")),
                Expect::FirstItem if byte == b']' => self.expect = Expect::Closed,
                Expect::FirstItem | Expect::Item => {
                    if matches!(byte, b']' | b',' | b'}' | b':') {
                        return Err(self.unexpected(index, byte));
                    }
                    start = index;
                    self.start_item(byte);
                }
                Expect::InItem => {
                    if self.step_in_item(byte) {
                        self.expect = Expect::Separator;
                        self.end_item(bytes, start, index + 1, &mut pieces)?;
                    }
                }
                Expect::InScalar => {
                    if is_json_space(byte) || matches!(byte, b',' | b']') {
                        self.expect = Expect::Separator;
                        self.end_item(bytes, start, index, &mut pieces)?;
                        // The byte that ended the scalar is read again, as a separator.
                        continue;
                    }
                }
                Expect::Separator if byte == b',' => self.expect = Expect::Item,
                Expect::Separator if byte == b']' => self.expect = Expect::Closed,
                Expect::Separator | Expect::Closed => return Err(self.unexpected(index, byte)),
            }
            index += 1;
        }
        if matches!(self.expect, Expect::InItem | Expect::InScalar) {
            self.hold(&bytes[start..]);
        }
        self.offset += bytes.len() as u64;
        Ok(pieces)
    }

    /// The end of the body: an array that never closed is malformed.
    pub fn finish(mut self) -> Result<(), MalformedArray> {
        let partial_mark = self.mark.unfinished();
        self.feed_unmarked(partial_mark)?;
        match self.expect {
            Expect::Closed => Ok(()),
            Expect::Open => Err(MalformedArray {
                offset: self.offset,
                reason: "it is empty".to_owned(),
            }),
            _ => Err(MalformedArray {
                offset: self.offset,
                reason: "it ends before the array closes".to_owned(),
            }),
        }
    }

    fn start_item(&mut self, byte: u8) {
        (self.depth, self.strings) = (0, StringScan::default());
        (self.broken, self.skipping) = (false, false);
        self.buffer.clear();
        self.expect = match self.strings.next(byte) {
            ByteIn::Token if matches!(byte, b'{' | b'[') => {
                self.depth = 1;
                Expect::InItem
            }
            ByteIn::Opens => Expect::InItem,
            _ => Expect::InScalar,
        };
    }

    /// Reads one byte inside an object, array or string item; true when it ends the item.
    fn step_in_item(&mut self, byte: u8) -> bool {
        match self.strings.next(byte) {
            ByteIn::Closes => self.depth == 0,
            ByteIn::Opens | ByteIn::String => false,
            ByteIn::Space => {
                self.broken |= matches!(byte, b'\n' | b'\r');
                false
            }
            ByteIn::Token => match byte {
                b'{' | b'[' => {
                    self.depth += 1;
                    false
                }
                b'}' | b']' => {
                    self.depth -= 1;
                    self.depth == 0
                }
                _ => false,
            },
        }
    }

    /// Keeps the item's bytes of this chunk, or starts skipping once it is too long.
    fn hold(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.buffer.len() + bytes.len() > self.max_item_bytes {
            self.buffer = Vec::new();
            self.skipping = true;
        } else {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// The item ending at `end` of this chunk is whole: checked, and answered as a piece.
    fn end_item(
        &mut self,
        bytes: &[u8],
        start: usize,
        end: usize,
        pieces: &mut Vec<Piece>,
    ) -> Result<(), MalformedArray> {
        self.hold(&bytes[start..end]);
        if self.skipping {
            self.skipping = false;
            pieces.push(Piece::TooLong);
            return Ok(());
        }
        let item = std::mem::take(&mut self.buffer);
        if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(&item) {
            return Err(MalformedArray {
                offset: self.offset + end as u64,
                reason: format!("the item before is not JSON: {error}"),
            });
        }
        let item = if self.broken { one_line(item) } else { item };
        // The check above skips over the insides of strings without reading them as text.
        pieces.push(match String::from_utf8(item) {
            Ok(text) => Piece::Line(text),
            Err(_) => Piece::NotUtf8,
        });
        Ok(())
    }

    fn malformed(&self, index: usize, reason: &str) -> MalformedArray {
        MalformedArray {
            offset: self.offset + index as u64,
            reason: reason.to_owned(),
        }
    }

    fn unexpected(&self, index: usize, byte: u8) -> MalformedArray {
        let what = match self.expect {
            Expect::Closed => "content after the array's end",
            Expect::Separator => "something other than `,` or `]` after an item",
            _ => "a missing item",
        };
        self.malformed(index, &format!("{what} ({:?})", char::from(byte)))
    }
}

/// Well-formed JSON without the whitespace between its tokens (strings untouched), in place.
fn one_line(mut json: Vec<u8>) -> Vec<u8> {
    let mut strings = StringScan::default();
    json.retain(|&byte| strings.next(byte) != ByteIn::Space);
    json
}

impl Importer {
    /// Takes one piece from a [`LineSplitter`] or an [`ArraySplitter`].
    pub async fn push_piece(&mut self, piece: Piece) -> Result<(), StoreError> {
        match piece {
            Piece::Line(line) => self.push_line(&line).await,
            Piece::NotUtf8 => {
                self.report.lines += 1;
                let line = self.report.lines;
                let reason = format!("the {} is not valid UTF-8", self.unit);
                self.report.refuse(line, None, reason);
                Ok(())
            }
            Piece::TooLong => {
                self.report.lines += 1;
                let line = self.report.lines;
                let reason = format!("the {} is longer than the limit", self.unit);
                self.report.refuse(line, None, reason);
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

    /// Feeds `body` to an array splitter in chunks of `chunk` bytes.
    fn items(body: &[u8], max: usize, chunk: usize) -> Result<Vec<String>, MalformedArray> {
        let mut splitter = ArraySplitter::new(max);
        let mut pieces = Vec::new();
        for part in body.chunks(chunk) {
            pieces.extend(splitter.feed(part)?);
        }
        splitter.finish()?;
        Ok(lines(pieces))
    }

    #[test]
    fn an_array_is_cut_into_its_items_in_any_chunks() {
        let body = br#" [ {"a": "x,]}\"{"}, {"b":[1,{"c":2}]},"s",-1.5e3 ,true,null,[] ]
"#;
        let expected = [
            r#"{"a": "x,]}\"{"}"#,
            r#"{"b":[1,{"c":2}]}"#,
            r#""s""#,
            "-1.5e3",
            "true",
            "null",
            "[]",
        ];
        for chunk in [1, 2, 3, 7, body.len()] {
            assert_eq!(
                items(body, 100, chunk).unwrap(),
                expected,
                "chunks of {chunk}"
            );
        }
        assert_eq!(items(b"[]", 100, 1).unwrap(), Vec::<String>::new());
        assert_eq!(items(b"\r\n[\t]\n", 100, 1).unwrap(), Vec::<String>::new());
    }

    /// An item spread over lines becomes one line (its strings untouched); one on a line keeps
    /// its bytes.
    #[test]
    fn an_item_over_several_lines_becomes_one_line() {
        let body = b"[\n  {\n    \"a\": \"x y\\n\",\n    \"b\": [1, 2]\n  },\n  {\"c\": 1}\n]\n";
        assert_eq!(
            items(body, 100, 5).unwrap(),
            [r#"{"a":"x y\n","b":[1,2]}"#, r#"{"c": 1}"#]
        );
    }

    #[test]
    fn a_long_item_is_refused_without_being_held_and_the_rest_go_on() {
        let long = format!(r#"{{"x": "{}"}}"#, "y".repeat(50));
        let body = format!(r#"[{{"a":1}}, {long}, {{"b":2}}]"#);
        for chunk in [1, 4, body.len()] {
            let mut splitter = ArraySplitter::new(20);
            let mut pieces = Vec::new();
            for part in body.as_bytes().chunks(chunk) {
                pieces.extend(splitter.feed(part).unwrap());
                assert!(splitter.buffer.len() <= 20);
            }
            splitter.finish().unwrap();
            assert_eq!(lines(pieces), [r#"{"a":1}"#, "<long>", r#"{"b":2}"#]);
        }
    }

    #[test]
    fn a_body_that_is_not_one_array_is_malformed() {
        for (body, reason) in [
            (&b""[..], "empty"),
            (b"  ", "empty"),
            (b"{\"a\":1}", "start with `[`"),
            (b"[{\"a\":1}", "ends before"),
            (b"[{\"a\":1},", "ends before"),
            (b"[{\"a\":1},]", "missing item"),
            (b"[,{\"a\":1}]", "missing item"),
            (b"[{\"a\":1} {\"b\":2}]", "other than"),
            (b"[{\"a\":1}] x", "after the array"),
            (b"[{\"a\":1}][]", "after the array"),
            (b"[{\"a\" 1}]", "not JSON"),
            (b"[{\"a\":1]]", "not JSON"),
            (b"[tru]", "not JSON"),
            (b"[1 2]", "other than"),
            (b"[\"open]", "ends before"),
        ] {
            for chunk in [1, 3, body.len().max(1)] {
                let error = items(body, 100, chunk).expect_err(&String::from_utf8_lossy(body));
                assert!(
                    error.reason.contains(reason),
                    "{:?}: {error}",
                    String::from_utf8_lossy(body)
                );
            }
        }
    }

    #[test]
    fn a_byte_order_mark_is_dropped_by_both_forms_however_it_is_cut() {
        let body = b"\xEF\xBB\xBF{\"a\":1}\n{\"b\":2}\n";
        for cut in 0..=body.len() {
            let mut splitter = LineSplitter::new(100);
            let mut pieces = splitter.feed(&body[..cut]);
            pieces.extend(splitter.feed(&body[cut..]));
            pieces.extend(splitter.finish());
            assert_eq!(lines(pieces), ["{\"a\":1}", "{\"b\":2}"], "cut at {cut}");
        }
        let array = b"\xEF\xBB\xBF[{\"a\":1}]";
        for cut in 0..=array.len() {
            let mut splitter = ArraySplitter::new(100);
            let mut pieces = splitter.feed(&array[..cut]).unwrap();
            pieces.extend(splitter.feed(&array[cut..]).unwrap());
            splitter.finish().unwrap();
            assert_eq!(lines(pieces), ["{\"a\":1}"], "cut at {cut}");
        }
        // Only a whole mark at the very start is dropped; anything else is read as it is.
        let mut splitter = LineSplitter::new(100);
        let mut pieces = splitter.feed(b"\xEF\xBBx\n");
        pieces.extend(splitter.feed(b"\xEF\xBB\xBFy\n"));
        assert_eq!(lines(pieces), ["<utf8>", "\u{feff}y"]);
        let mut splitter = ArraySplitter::new(100);
        assert!(splitter.feed(b"\xEF\xBB").unwrap().is_empty());
        assert!(splitter.finish().is_err());
    }

    #[test]
    fn a_report_stays_small_whatever_it_refuses() {
        let mut report = ImportReport::default();
        let huge = format!("invalid type: string \"{}\"", "é".repeat(1 << 20));
        for line in 0..1_000 {
            report.refuse(line, Some(huge.clone()), huge.clone());
        }
        assert_eq!(report.refused, 1_000);
        assert_eq!(report.refusals.len(), MAX_LISTED_REFUSALS);
        for refusal in &report.refusals {
            assert!(refusal.reason.len() <= REFUSAL_TEXT_BYTES + '…'.len_utf8());
            assert!(refusal.reason.starts_with("invalid type: string"));
            assert!(refusal.reason.ends_with('…'));
            assert!(refusal.uuid.as_ref().unwrap().len() <= REFUSAL_TEXT_BYTES + 3);
        }
        let mut part = ImportReport::default();
        for index in 0..250 {
            part.add_sidechain(&format!("t.agent-{index}"));
        }
        assert_eq!(part.sidechain_threads.len(), MAX_LISTED_SIDECHAINS);
        let mut total = ImportReport::default();
        total.add_sidechain("t.agent-0");
        total.absorb(part);
        assert_eq!(total.sidechain_thread_count, 250);
        assert_eq!(total.sidechain_threads.len(), MAX_LISTED_SIDECHAINS);
    }
}
