//! `app::run` in-process: the API and the workers over one store, and what a shutdown does to
//! the requests and jobs in flight.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::StatusCode;
use loupe::app::App;
use loupe::http::{AuthMode, Limits};
use loupe::jobs::JobsConfig;
use loupe::store::{Store, StoreOptions};
use loupe::summarize::{SummarizeError, Summarizer, Summary, SummaryRequest};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify};

use crate::common::{assistant, user, TestApp};

on_both_backends!(
    a_request_in_flight_at_shutdown_finishes,
    a_job_still_running_when_the_grace_period_ends_is_given_back,
);

/// A summarizer that says when it starts and then never answers, like a hung provider.
struct Hung {
    started: Arc<Notify>,
}

#[async_trait]
impl Summarizer for Hung {
    fn name(&self) -> String {
        "hung".to_owned()
    }
    async fn summarize(&self, _: &SummaryRequest) -> Result<Summary, SummarizeError> {
        self.started.notify_one();
        std::future::pending().await
    }
}

/// A second connection to the test's database: `app::run` closes the store it is given.
async fn own_store(app: &TestApp) -> Store {
    Store::connect(&StoreOptions::new(&app.url))
        .await
        .expect("connect")
}

fn service(store: Store, listener: Option<tokio::net::TcpListener>, workers: usize) -> App {
    App {
        store,
        auth: AuthMode::Open,
        limits: Limits {
            rate_limit_per_sec: 0.0,
            ..Limits::default()
        },
        listener,
        workers,
        jobs: JobsConfig::default(),
        summarizer: Arc::new(loupe::summarize::ExtractiveSummarizer::new()),
        grace: Duration::from_secs(30),
    }
}

async fn a_request_in_flight_at_shutdown_finishes(app: TestApp) {
    let thread = app.thread("inflight").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, fired) = oneshot::channel::<()>();
    let running = tokio::spawn(loupe::app::run(
        service(own_store(&app).await, Some(listener), 0),
        async move {
            let _ = fired.await;
        },
    ));

    // An append whose body is still arriving when the shutdown signal comes.
    let body =
        json!({"messages": [user("late-0", "sent before shutdown, finished after")]}).to_string();
    let (head, tail) = body.as_bytes().split_at(body.len() / 2);
    let mut connection = tokio::net::TcpStream::connect(addr).await.unwrap();
    connection
        .write_all(
            format!(
                "POST /v1/threads/{thread}/messages HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    connection.write_all(head).await.unwrap();
    // Give the server the time to read the request head, so the request is in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    connection.write_all(tail).await.unwrap();

    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut buffer = [0u8; 4096];
        loop {
            let n = connection.read(&mut buffer).await.unwrap();
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&response).contains("\"next_seq\"") {
                break;
            }
        }
    })
    .await
    .expect("the in-flight request is answered");
    let response = String::from_utf8_lossy(&response).into_owned();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    drop(connection);

    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the service stops once nothing is in flight")
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "a stopped service accepts no connection"
    );
    let page = app
        .get(&format!("/v1/threads/{thread}/messages?limit=10"))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.body["messages"][0]["uuid"], "late-0");
    app.finish().await;
}

async fn a_job_still_running_when_the_grace_period_ends_is_given_back(app: TestApp) {
    let thread = app.thread("hung").await;
    let mut messages = Vec::new();
    for i in 0..8 {
        messages.push(user(
            &format!("u{i}"),
            &format!("Question {i}? {}", "why ".repeat(50)),
        ));
        messages.push(assistant(
            &format!("a{i}"),
            &format!("msg_{i}"),
            &format!("Answer {i}. {}", "because ".repeat(50)),
        ));
    }
    app.append(&thread, &messages).await;
    let compaction = app
        .post(&format!("/v1/threads/{thread}/compact"), json!({}))
        .await;
    assert_eq!(
        compaction.status,
        StatusCode::ACCEPTED,
        "{}",
        compaction.body
    );
    let job_id = compaction.body["id"]
        .as_str()
        .expect("the job's id")
        .to_owned();

    let started = Arc::new(Notify::new());
    let mut hung = service(own_store(&app).await, None, 1);
    hung.summarizer = Arc::new(Hung {
        started: started.clone(),
    });
    hung.grace = Duration::from_millis(200);
    let (shutdown, fired) = oneshot::channel::<()>();
    let running = tokio::spawn(loupe::app::run(hung, async move {
        let _ = fired.await;
    }));
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("a worker claims the compaction");
    let job = app.get(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job.body["state"], "running", "{}", job.body);

    shutdown.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the service stops after the grace period")
        .unwrap()
        .unwrap();

    let job: Value = app.get(&format!("/v1/jobs/{job_id}")).await.body;
    assert_eq!(job["state"], "pending", "given back to the queue: {job}");
    assert_eq!(
        job["attempts"], 0,
        "the cut-off attempt does not count: {job}"
    );
    app.finish().await;
}
