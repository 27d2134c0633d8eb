//! Drills against the real binary: SIGKILL in the middle of appends and of a compaction, and a
//! PostgreSQL restart under append load (on a throwaway cluster this test starts itself).
//!
//! The binary is `LOUPE_DRILL_BIN` when set (`.ci/run` points it at the release build), else the
//! debug build of this test run. Waiting loops have generous deadlines; nothing asserts a time.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fake_provider::{Fake, Step};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

pub(crate) fn binary() -> PathBuf {
    std::env::var_os("LOUPE_DRILL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_loupe")))
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The service as a child process, killed when dropped.
pub(crate) struct Service {
    child: Child,
    pub(crate) base: String,
}

impl Service {
    pub(crate) async fn start(
        port: u16,
        database_url: &str,
        env: &[(&str, &str)],
        log: &Path,
    ) -> Service {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut command = Command::new(binary());
        command
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .args(["--database-url", database_url])
            .args(["--instance-id", "drill", "--workers", "1"])
            .args(["--rate-limit-per-sec", "0", "--job-poll-ms", "100"])
            .env_remove("LOUPE_ADMIN_KEY")
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let child = command.spawn().expect("start the loupe binary");
        let service = Service {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = client();
        wait_for("the service to answer /healthz", || {
            let client = client.clone();
            let url = format!("{}/healthz", service.base);
            async move {
                client
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        service
    }

    /// SIGKILL: no shutdown code runs.
    pub(crate) async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Polls `ready` every 100 ms; panics after two minutes.
pub(crate) async fn wait_for<F, Fut>(what: &str, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready().await {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the appenders saw: acknowledged uuids, and every status answered.
#[derive(Default)]
struct Ledger {
    acknowledged: Vec<String>,
    statuses: HashMap<u16, usize>,
}

/// Appends batches of three messages from `writers` tasks until `stop`, recording what was
/// acknowledged. A batch that was not acknowledged is retried as is (idempotent by uuid) until
/// it is, so every batch is either acknowledged or abandoned at `stop`.
fn start_appenders(
    base: Arc<Mutex<String>>,
    thread: &str,
    writers: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (base, ledger, stop) = (base.clone(), ledger.clone(), stop.clone());
            let thread = thread.to_owned();
            tokio::spawn(async move {
                let client = client();
                let mut batch = 0;
                while !stop.is_cancelled() {
                    let uuids: Vec<String> =
                        (0..3).map(|i| format!("w{w}-b{batch}-m{i}")).collect();
                    let messages: Vec<Value> = uuids
                        .iter()
                        .map(|uuid| crate::common::user(uuid, &format!("text of {uuid}")))
                        .collect();
                    loop {
                        if stop.is_cancelled() {
                            return;
                        }
                        let url = format!("{}/v1/threads/{thread}/messages", base.lock().unwrap());
                        let sent = client
                            .post(url)
                            .json(&json!({ "messages": messages }))
                            .send()
                            .await;
                        // No answer: the process is down (killed, restarting); try again.
                        if let Ok(response) = sent {
                            let status = response.status().as_u16();
                            let mut ledger = ledger.lock().unwrap();
                            *ledger.statuses.entry(status).or_default() += 1;
                            if status == 200 || status == 201 {
                                ledger.acknowledged.extend(uuids.iter().cloned());
                                break;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    batch += 1;
                }
            })
        })
        .collect()
}

/// Every message of the thread, paged.
async fn all_messages(base: &str, thread: &str) -> Vec<Value> {
    let client = client();
    let mut messages = Vec::new();
    let mut after = None;
    loop {
        let mut url = format!("{base}/v1/threads/{thread}/messages?limit=1000");
        if let Some(after) = after {
            url.push_str(&format!("&after_seq={after}"));
        }
        let page: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        messages.extend(page["messages"].as_array().unwrap().iter().cloned());
        match page["next_after_seq"].as_i64() {
            Some(next) => after = Some(next),
            None => return messages,
        }
    }
}

/// Seqs are 0..n without a gap, no uuid is stored twice, and every acknowledged uuid is stored.
fn assert_whole(messages: &[Value], acknowledged: &[String]) {
    let seqs: Vec<i64> = messages
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (0..messages.len() as i64).collect::<Vec<_>>(),
        "seqs are dense"
    );
    let mut stored = HashSet::new();
    for message in messages {
        let uuid = message["uuid"].as_str().unwrap().to_owned();
        assert!(stored.insert(uuid.clone()), "{uuid} is stored twice");
    }
    for uuid in acknowledged {
        assert!(stored.contains(uuid), "acknowledged {uuid} was lost");
    }
}

/// Rounds worth compacting: prompt, tool call, result, answer.
fn rounds(n: usize) -> Vec<Value> {
    crate::common::tool_rounds("q", 0, n, 50)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_appends_and_mid_compaction_loses_nothing_and_the_job_completes() {
    let dir = std::env::temp_dir().join(format!("loupe-drill-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let database_url = format!("sqlite://{}", dir.join("drill.db").display());
    let log = dir.join("loupe.log");
    // The first summary never comes back (the process is killed while it waits); the ones
    // after the restart are answered at once.
    let fake = Fake::start(
        Some("drill-key"),
        vec![Step::Sleep(Duration::from_secs(600))],
    )
    .await;
    let env = [
        ("LOUPE_SUMMARIZER", "anthropic"),
        ("LOUPE_SUMMARIZER_BASE_URL", fake.base_url.as_str()),
        ("LOUPE_SUMMARIZER_API_KEY", "drill-key"),
        ("LOUPE_SUMMARIZER_TIMEOUT_SECS", "900"),
    ];
    let port = free_port();
    let service = Service::start(port, &database_url, &env, &log).await;
    let client = client();
    let base = service.base.clone();
    let created = client
        .post(format!("{base}/v1/threads"))
        .json(&json!({"id": "drill"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let appended = client
        .post(format!("{base}/v1/threads/drill/messages"))
        .json(&json!({ "messages": rounds(4) }))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 201);
    let job: Value = client
        .post(format!("{base}/v1/threads/drill/compact"))
        .json(&json!({"keep_recent_rounds": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job_id = job["id"].as_str().unwrap().to_owned();
    let job_url = format!("{base}/v1/jobs/{job_id}");
    let job_state = |client: reqwest::Client, url: String| async move {
        let job: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        job["state"].as_str().unwrap_or_default().to_owned()
    };
    wait_for("the compaction to be running", || {
        job_state(client.clone(), job_url.clone()).map_eq("running")
    })
    .await;
    wait_for("the summarizer to be asked", || {
        let asked = !fake.requests().is_empty();
        async move { asked }
    })
    .await;

    // Appends race the kill.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let target = Arc::new(Mutex::new(base.clone()));
    let appenders = start_appenders(target, "drill", 4, ledger.clone(), stop.clone());
    wait_for("appends to be acknowledged", || {
        let count = ledger.lock().unwrap().acknowledged.len();
        async move { count >= 60 }
    })
    .await;
    service.kill().await;
    // Same database, same instance id: the job it held is given back at start.
    let service = Service::start(port, &database_url, &env, &log).await;
    let before = ledger.lock().unwrap().acknowledged.len();
    wait_for("appends after the restart", || {
        let count = ledger.lock().unwrap().acknowledged.len();
        async move { count >= before + 30 }
    })
    .await;
    stop.cancel();
    for appender in appenders {
        appender.await.unwrap();
    }
    wait_for("the compaction to complete", || {
        job_state(client.clone(), job_url.clone()).map_eq("succeeded")
    })
    .await;
    let job: Value = client
        .get(&job_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["result"]["compacted"], true, "{job}");

    let messages = all_messages(&service.base, "drill").await;
    let acknowledged = ledger.lock().unwrap().acknowledged.clone();
    assert_whole(&messages, &acknowledged);
    let boundaries = messages
        .iter()
        .filter(|m| m["subtype"] == "compact_boundary")
        .count();
    assert_eq!(boundaries, 1, "exactly one compaction was written");
    service.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `fut.map_eq(x)`: whether the future's string equals `x`.
trait MapEq {
    fn map_eq(self, expected: &'static str) -> impl std::future::Future<Output = bool>;
}

impl<F: std::future::Future<Output = String>> MapEq for F {
    async fn map_eq(self, expected: &'static str) -> bool {
        self.await == expected
    }
}

/// The directory holding `initdb` and `pg_ctl`, when PostgreSQL is installed.
fn postgres_bin_dir() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

/// Runs a PostgreSQL tool as the `postgres` user (PostgreSQL refuses to run as root).
fn pg_tool(bin: &Path, tool: &str, args: &[&str]) {
    let program = bin.join(tool);
    let status = if is_root() {
        std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&program)
            .args(args)
            .stdout(Stdio::null())
            .status()
    } else {
        std::process::Command::new(&program)
            .args(args)
            .stdout(Stdio::null())
            .status()
    }
    .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    assert!(status.success(), "{tool} {args:?} failed: {status}");
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A PostgreSQL cluster of its own in a temporary directory, on a free port; stopped and
/// removed on drop.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Cluster {
    fn start(bin: PathBuf) -> Cluster {
        let dir = PathBuf::from(format!(
            "/tmp/loupe-pg-drill-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let chown = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(chown.success());
        }
        let port = free_port();
        let data = dir.join("data");
        let data = data.to_str().unwrap();
        pg_tool(
            &bin,
            "initdb",
            &["-D", data, "-U", "loupe", "--auth=trust", "-E", "UTF8"],
        );
        let cluster = Cluster { bin, dir, port };
        cluster.pg_ctl(&["start"]);
        cluster
    }

    fn pg_ctl(&self, action: &[&str]) {
        let data = self.dir.join("data");
        let log = self.dir.join("postgres.log");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let mut args = vec!["-D", data.to_str().unwrap(), "-l", log.to_str().unwrap()];
        args.extend(["-o", &options, "-w"]);
        args.extend(action);
        pg_tool(&self.bin, "pg_ctl", &args);
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://loupe@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_under_append_load_gives_only_503s() {
    let Some(bin) = postgres_bin_dir() else {
        println!("skipped: no PostgreSQL binaries under /usr/lib/postgresql");
        return;
    };
    let cluster = Cluster::start(bin);
    let admin =
        loupe::store::Store::connect(&loupe::store::StoreOptions::new(cluster.url("postgres")))
            .await
            .expect("connect to the drill cluster");
    admin.create_database("drill").await.unwrap();
    admin.close().await;
    let log = cluster.dir.join("loupe.log");
    let port = free_port();
    let service = Service::start(port, &cluster.url("drill"), &[], &log).await;
    let client = client();
    let created = client
        .post(format!("{}/v1/threads", service.base))
        .json(&json!({"id": "load"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let target = Arc::new(Mutex::new(service.base.clone()));
    let appenders = start_appenders(target, "load", 4, ledger.clone(), stop.clone());
    for restart in 0..3 {
        let before = ledger.lock().unwrap().acknowledged.len();
        wait_for("appends between restarts", || {
            let count = ledger.lock().unwrap().acknowledged.len();
            async move { count >= before + 30 }
        })
        .await;
        println!("restart {restart} after {before} acknowledged messages");
        cluster.pg_ctl(&["-m", "immediate", "restart"]);
    }
    let before = ledger.lock().unwrap().acknowledged.len();
    wait_for("appends after the last restart", || {
        let count = ledger.lock().unwrap().acknowledged.len();
        async move { count >= before + 30 }
    })
    .await;
    stop.cancel();
    for appender in appenders {
        appender.await.unwrap();
    }
    let statuses = ledger.lock().unwrap().statuses.clone();
    println!("statuses answered: {statuses:?}");
    for status in statuses.keys() {
        assert!(
            matches!(status, 200 | 201 | 503),
            "a restart answered {status}: {statuses:?}"
        );
    }
    let messages = all_messages(&service.base, "load").await;
    let acknowledged = ledger.lock().unwrap().acknowledged.clone();
    assert_whole(&messages, &acknowledged);
    service.kill().await;
    drop(cluster);
}
