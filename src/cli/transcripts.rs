//! `loupe import` and `loupe export`: transcripts (JSON Lines, or a JSON array of entries) in and
//! out of a thread, on the database directly or through a running server (`--url`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Map;
use tokio::io::AsyncReadExt;

use super::{tenant_arg, DatabaseArgs};
use crate::import::{FileSplitter, ImportReport, Importer, Piece};
use crate::store::{NewThread, PageBytes, Seq, Store, StoreError, TenantId, ThreadId};

/// Longest line read from a file (a larger one is refused, not held).
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;
/// Bytes read from a file at a time.
const READ_CHUNK: usize = 256 * 1024;
/// Lines per request in `--url` mode. The server would take one streamed body of any length;
/// parts keep what a failed request must resend small, and each retried part is idempotent.
const LINES_PER_REQUEST: usize = 2_000;
/// Bytes per request in `--url` mode (lines are never split).
const BYTES_PER_REQUEST: usize = 8 * 1024 * 1024;

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// JSON Lines files (Claude Code session files) or JSON arrays of entries (an export with
    /// `Accept: application/json`), imported in order into the thread.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The thread to import into; created when missing. Sub-agent entries go to
    /// `<thread>.agent-<agentId>`.
    #[arg(long)]
    pub thread: String,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The thread to export.
    #[arg(long)]
    pub thread: String,
    /// Write here instead of standard output.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub target: TargetArgs,
}

/// Where the thread is: the database, or a running server.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The tenant, on the database directly (through a server, the key decides).
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// A running Loupe (`http://127.0.0.1:8080`) to go through instead of the database.
    #[arg(long)]
    pub url: Option<String>,
    /// The API key for `--url`.
    #[arg(long, env = "LOUPE_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

pub async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} {pos} entries ({per_sec}) {elapsed} {msg}")
            .expect("a valid template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let report = match &args.target.url {
        Some(url) => import_through(url, &args, &progress).await?,
        None => import_direct(&args, &progress).await?,
    };
    progress.finish_and_clear();
    for refusal in &report.refusals {
        let uuid = refusal.uuid.as_deref().unwrap_or("-");
        eprintln!("refused line {} ({uuid}): {}", refusal.line, refusal.reason);
    }
    if report.refused > report.refusals.len() as u64 {
        eprintln!(
            "… and {} more refused",
            report.refused - report.refusals.len() as u64
        );
    }
    eprintln!(
        "{} lines: {} stored, {} already stored, {} refused",
        report.lines, report.stored, report.already_stored, report.refused
    );
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

fn show(progress: &ProgressBar, report: &ImportReport) {
    progress.set_position(report.lines);
    progress.set_message(format!(
        "stored {}, already stored {}, refused {}",
        report.stored, report.already_stored, report.refused
    ));
}

async fn import_direct(args: &ImportArgs, progress: &ProgressBar) -> anyhow::Result<ImportReport> {
    let tenant = tenant_arg(&args.target.tenant)?;
    // Every file opens before anything is written, so a mistyped path creates no thread.
    let mut files = open_all(&args.files).await?;
    let store = args.target.database.open().await?;
    let thread = ThreadId::new(args.thread.as_str());
    ensure_thread(&store, &tenant, &thread).await?;
    let mut total = ImportReport::default();
    let mut previous_uuid = String::new();
    for file in &mut files {
        let mut importer = Importer::new(
            store.clone(),
            tenant.clone(),
            thread.clone(),
            previous_uuid.clone(),
        );
        let shown = total.clone();
        while let Some(pieces) = file.next_pieces().await? {
            if file.is_array() {
                importer = importer.of_array_items();
            }
            for piece in pieces {
                importer.push_piece(piece).await?;
            }
            let mut now = shown.clone();
            now.absorb(importer.report().clone());
            show(progress, &now);
        }
        let mut report = importer.finish().await?;
        offset_lines(&mut report, total.lines);
        if let Some(uuid) = &report.last_uuid {
            previous_uuid.clone_from(uuid);
        }
        total.absorb(report);
        show(progress, &total);
    }
    store.close().await;
    Ok(total)
}

/// An import file, read a chunk at a time and cut into pieces by the form its start shows.
struct ImportFile {
    path: PathBuf,
    file: tokio::fs::File,
    splitter: Option<FileSplitter>,
    buffer: Vec<u8>,
    ended: bool,
}

async fn open_all(paths: &[PathBuf]) -> anyhow::Result<Vec<ImportFile>> {
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let file = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("cannot open {}", path.display()))?;
        files.push(ImportFile {
            path: path.clone(),
            file,
            splitter: None,
            buffer: vec![0_u8; READ_CHUNK],
            ended: false,
        });
    }
    Ok(files)
}

impl ImportFile {
    /// The pieces the next chunk completes (the last call gives the file's last piece), or
    /// `None` at the end. A file that starts as a JSON array but is not one is an error.
    async fn next_pieces(&mut self) -> anyhow::Result<Option<Vec<Piece>>> {
        if self.ended {
            return Ok(None);
        }
        let read = self.file.read(&mut self.buffer).await?;
        let chunk = &self.buffer[..read];
        let splitter = self
            .splitter
            .get_or_insert_with(|| FileSplitter::for_start(chunk, MAX_LINE_BYTES));
        let context = || format!("{} is not a JSON array of entries", self.path.display());
        let mut pieces = splitter.feed(chunk).with_context(context)?;
        if read == 0 {
            self.ended = true;
            let splitter = self.splitter.take().expect("set above");
            pieces.extend(splitter.finish().with_context(context)?);
        }
        Ok(Some(pieces))
    }

    fn is_array(&self) -> bool {
        self.splitter.as_ref().is_some_and(FileSplitter::is_array)
    }
}

async fn ensure_thread(store: &Store, tenant: &TenantId, thread: &ThreadId) -> anyhow::Result<()> {
    let new = NewThread {
        id: Some(thread.clone()),
        metadata: Map::new(),
    };
    match store.create_thread(tenant, new).await {
        Ok(_) | Err(StoreError::ThreadExists(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Refusal line numbers count from the start of the whole import.
fn offset_lines(report: &mut ImportReport, before: u64) {
    for refusal in &mut report.refusals {
        refusal.line += before;
    }
}

async fn import_through(
    url: &str,
    args: &ImportArgs,
    progress: &ProgressBar,
) -> anyhow::Result<ImportReport> {
    let mut files = open_all(&args.files).await?;
    let client = Client::new(url, args.target.key.clone())?;
    let created = client
        .send(|c| {
            c.post(client.url("/v1/threads"))
                .json(&serde_json::json!({"id": args.thread}))
        })
        .await?;
    if !(created.status().is_success() || created.status() == reqwest::StatusCode::CONFLICT) {
        bail!(
            "creating the thread: {} {}",
            created.status(),
            created.text().await.unwrap_or_default()
        );
    }
    let import_url = client.url(&format!("/v1/threads/{}/import", args.thread));
    let mut total = ImportReport::default();
    let mut previous_uuid = String::new();
    for file in &mut files {
        let mut body: Vec<u8> = Vec::new();
        let mut lines = 0;
        while let Some(pieces) = file.next_pieces().await? {
            for piece in pieces {
                match piece {
                    Piece::Line(line) => body.extend_from_slice(line.as_bytes()),
                    // The server refuses these too; an empty JSON string keeps the line count.
                    Piece::NotUtf8 | Piece::TooLong => body.extend_from_slice(b"\"\""),
                }
                body.push(b'\n');
                lines += 1;
                if lines >= LINES_PER_REQUEST || body.len() >= BYTES_PER_REQUEST {
                    let sent = std::mem::take(&mut body);
                    lines = 0;
                    let report = post_part(&client, &import_url, &previous_uuid, sent).await?;
                    absorb_part(&mut total, &mut previous_uuid, report);
                    show(progress, &total);
                }
            }
        }
        if !body.is_empty() {
            let sent = std::mem::take(&mut body);
            let report = post_part(&client, &import_url, &previous_uuid, sent).await?;
            absorb_part(&mut total, &mut previous_uuid, report);
            show(progress, &total);
        }
    }
    Ok(total)
}

fn absorb_part(total: &mut ImportReport, previous_uuid: &mut String, mut part: ImportReport) {
    offset_lines(&mut part, total.lines);
    if let Some(uuid) = &part.last_uuid {
        previous_uuid.clone_from(uuid);
    }
    total.absorb(part);
}

async fn post_part(
    client: &Client,
    url: &str,
    previous_uuid: &str,
    body: Vec<u8>,
) -> anyhow::Result<ImportReport> {
    let response = client
        .send(|c| {
            c.post(url)
                .query(&[("previous_uuid", previous_uuid)])
                .header(reqwest::header::CONTENT_TYPE, "application/x-ndjson")
                .body(body.clone())
        })
        .await?;
    if !response.status().is_success() {
        bail!(
            "importing: {} {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    Ok(response.json().await?)
}

pub async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let Some(path) = &args.output else {
        let mut out = std::io::BufWriter::new(std::io::stdout());
        export_to(&args, &mut out).await?;
        return Ok(out.flush()?);
    };
    // Written beside the target and renamed over it once whole, so a failed export (a mistyped
    // thread, a dropped connection) leaves an existing file as it was.
    let mut partial_name = path.file_name().unwrap_or_default().to_owned();
    partial_name.push(".partial");
    let partial = path.with_file_name(partial_name);
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let written = export_to(&args, &mut out).await;
    let finished = written.and_then(|()| Ok(out.into_inner()?.sync_all()?));
    if let Err(error) = finished {
        let _ = std::fs::remove_file(&partial);
        return Err(error);
    }
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot move the export to {}", path.display()))
}

async fn export_to(args: &ExportArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match &args.target.url {
        Some(url) => {
            let client = Client::new(url, args.target.key.clone())?;
            let path = format!("/v1/threads/{}/export", args.thread);
            let mut response = client.send(|c| c.get(client.url(&path))).await?;
            if !response.status().is_success() {
                bail!(
                    "exporting: {} {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                );
            }
            while let Some(chunk) = response.chunk().await? {
                out.write_all(&chunk)?;
            }
        }
        None => {
            let tenant = tenant_arg(&args.target.tenant)?;
            let store = args.target.database.open().await?;
            let thread = ThreadId::new(args.thread.as_str());
            let mut after = -1;
            // Pages cut as the API cuts them; one process, no budget to keep.
            let bytes = PageBytes::unroomed(crate::http::transcripts::EXPORT_PAGE_BYTES as i64);
            loop {
                let page = store
                    .export_page(
                        &tenant,
                        &thread,
                        Seq::new(after),
                        crate::http::transcripts::EXPORT_PAGE_ENTRIES,
                        bytes,
                    )
                    .await?;
                let Some((last, _)) = page.last() else { break };
                after = *last;
                out.write_all(&crate::http::transcripts::jsonl(&page))?;
            }
            store.close().await;
        }
    }
    out.flush()?;
    Ok(())
}

/// A small HTTP client for `--url`: the bearer key, and retries of answers that say to retry.
struct Client {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Client {
    fn new(base: &str, key: Option<String>) -> anyhow::Result<Self> {
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            key,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(300))
                .build()?,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends the request `build` makes, again after 429 or 503 (imports are idempotent).
    async fn send(
        &self,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> anyhow::Result<reqwest::Response> {
        let mut delay = Duration::from_millis(500);
        for attempt in 1.. {
            let mut request = build(&self.http);
            if let Some(key) = &self.key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await?;
            let status = response.status();
            let retry = status == reqwest::StatusCode::TOO_MANY_REQUESTS
                || status == reqwest::StatusCode::SERVICE_UNAVAILABLE;
            if !retry || attempt >= 6 {
                return Ok(response);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        unreachable!("the loop returns")
    }
}
