//! What the benchmarks share: scratch databases (a SQLite file in the temporary directory, or a
//! fresh PostgreSQL database made through an admin URL, removed when dropped, also when a
//! benchmark panics), the open service router, one request through it, and batches of entries
//! cycled from a template. Each bench uses a part of it.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;

use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use loupe::history::Entry;
use loupe::http::{AppState, AuthMode, Limits};
use loupe::store::{Store, StoreOptions};
use serde_json::Value;
use tower::ServiceExt;

/// The PostgreSQL admin URL (a role that may create databases): `BENCH_DATABASE_URL`, else
/// `TEST_DATABASE_URL`. Without either, says that the PostgreSQL half is skipped.
pub fn admin_url() -> Option<String> {
    let url = std::env::var("BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("TEST_DATABASE_URL"))
        .ok();
    if url.is_none() {
        println!(
            "NOTICE: neither BENCH_DATABASE_URL nor TEST_DATABASE_URL is set: the PostgreSQL \
             measurements are skipped (set one to a role that may create databases, e.g. \
             postgres://loupe:loupe@127.0.0.1:5432/postgres)"
        );
    }
    url
}

/// A database that exists for this run.
pub struct ScratchDb {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    File(PathBuf),
    Database { admin_url: String, name: String },
}

impl ScratchDb {
    pub fn sqlite() -> ScratchDb {
        let path = std::env::temp_dir()
            .join("loupe-bench")
            .join(format!("{}.db", uuid::Uuid::new_v4().simple()));
        ScratchDb {
            url: format!("sqlite://{}", path.display()),
            cleanup: Cleanup::File(path),
        }
    }

    pub fn postgres(admin_url: &str) -> ScratchDb {
        let name = format!("loupe_bench_{}", uuid::Uuid::new_v4().simple());
        let (admin, db) = (admin_url.to_owned(), name.clone());
        on_own_runtime(async move {
            let store = Store::connect(&StoreOptions::new(&admin))
                .await
                .expect("connect to the PostgreSQL admin URL");
            store.create_database(&db).await.expect("create database");
            store.close().await;
        });
        println!("postgres: created database {name}");
        ScratchDb {
            url: loupe::store::database_url(admin_url, &name),
            cleanup: Cleanup::Database {
                admin_url: admin_url.to_owned(),
                name,
            },
        }
    }

    /// Connects with `options` (whose URL is replaced by this database's) and migrates.
    pub async fn open(&self, options: StoreOptions) -> Store {
        let store = Store::connect(&StoreOptions {
            url: self.url.clone(),
            ..options
        })
        .await
        .expect("connect to the scratch database");
        store.migrate().await.expect("migrate");
        store
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Database { admin_url, name } => {
                let (admin, db) = (admin_url.clone(), name.clone());
                let dropped = on_own_runtime(async move {
                    let store = Store::connect(&StoreOptions::new(&admin)).await?;
                    store.drop_database(&db).await?;
                    store.close().await;
                    Ok::<_, loupe::store::StoreError>(())
                });
                match dropped {
                    Ok(()) => println!("postgres: dropped database {name}"),
                    Err(error) => eprintln!("postgres: could not drop database {name}: {error}"),
                }
            }
        }
    }
}

/// Runs `work` to completion on a runtime of its own, in a thread of its own: callable from
/// synchronous code, from inside another runtime, and while unwinding.
fn on_own_runtime<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    })
    .join()
    .expect("the scratch database thread")
}

/// The service in open mode without a rate limit (benchmarks send far more than 50 requests/s).
pub fn router(store: &Store) -> Router {
    let limits = Limits {
        rate_limit_per_sec: 0.0,
        ..Limits::default()
    };
    loupe::http::router(AppState::new(store.clone(), limits, AuthMode::Open))
}

/// One request through the router; the status and the whole body.
pub async fn send(
    router: &Router,
    method: Method,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Bytes) {
    let mut request = Request::builder().method(method).uri(uri);
    let body = match body {
        Some(json) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(serde_json::to_vec(&json).unwrap())
        }
        None => Body::empty(),
    };
    let response = router
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .expect("the router answers");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    (status, bytes)
}

/// Entry `n` of the template (cycled), with the uuid `{tag}-{n}` and no seq.
pub fn cycled(template: &[Entry], tag: &str, n: usize) -> Entry {
    let mut entry = template[n % template.len()].clone();
    entry.seq = None;
    entry.uuid = Some(format!("{tag}-{n}"));
    entry
}

/// `count` entries cycled from the template, numbered on from `*next`.
pub fn batch(template: &[Entry], tag: &str, next: &mut usize, count: usize) -> Vec<Entry> {
    (0..count)
        .map(|_| {
            *next += 1;
            cycled(template, tag, *next - 1)
        })
        .collect()
}

/// A migrated store over a scratch database; `finish` closes it and removes the database.
pub struct Scratch {
    pub store: Store,
    db: ScratchDb,
}

impl Scratch {
    /// `options` with any URL: the scratch database's replaces it.
    pub async fn sqlite(options: StoreOptions) -> Scratch {
        let db = ScratchDb::sqlite();
        Scratch {
            store: db.open(options).await,
            db,
        }
    }

    pub async fn postgres(admin_url: &str, options: StoreOptions) -> Scratch {
        let db = ScratchDb::postgres(admin_url);
        Scratch {
            store: db.open(options).await,
            db,
        }
    }

    pub async fn finish(self) {
        self.store.close().await;
        drop(self.db);
    }
}

/// Runs `run(backend, url)` on a scratch SQLite database, then, when an admin URL is set, on a
/// scratch PostgreSQL database; each is removed afterwards (also when `run` panics).
pub fn on_each_backend(mut run: impl FnMut(&str, &str)) {
    let db = ScratchDb::sqlite();
    run("sqlite", &db.url);
    drop(db);
    if let Some(admin_url) = admin_url() {
        let db = ScratchDb::postgres(&admin_url);
        run("postgres", &db.url);
        drop(db);
    }
}
