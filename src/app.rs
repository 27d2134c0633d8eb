//! The running service, apart from its command line: the HTTP API and the job workers over one
//! store, until a shutdown signal. `cli::serve` builds an [`App`] from flags; tests build one
//! directly and drive the shutdown themselves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http::{AppState, AuthMode, Limits};
use crate::jobs::{JobsConfig, Runner};
use crate::store::Store;
use crate::summarize::Summarizer;

/// Everything a running service needs, already opened and checked.
pub struct App {
    pub store: Store,
    pub auth: AuthMode,
    pub limits: Limits,
    /// Serves HTTP on this listener; `None` runs the workers only.
    pub listener: Option<TcpListener>,
    /// Job worker tasks; 0 runs the API only.
    pub workers: usize,
    pub jobs: JobsConfig,
    pub summarizer: Arc<dyn Summarizer>,
    /// Time in-flight requests and running jobs get once `shutdown` has fired.
    pub grace: Duration,
}

/// Serves until `shutdown` completes, then drains: the listener stops accepting, workers stop
/// claiming, in-flight requests and running jobs get the grace period, and a job still running
/// after it is given back to the queue. The store is closed on the way out.
pub async fn run(
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let App {
        store,
        auth,
        limits,
        listener,
        workers,
        jobs,
        summarizer,
        grace,
    } = app;
    let stop = CancellationToken::new();
    // Fires when the grace period is over: workers give their running jobs back.
    let abort = CancellationToken::new();
    tokio::spawn({
        let (stop, abort) = (stop.clone(), abort.clone());
        async move {
            shutdown.await;
            stop.cancel();
            tokio::time::sleep(grace).await;
            abort.cancel();
        }
    });

    let mut handles = Vec::new();
    if workers > 0 {
        // Jobs this instance held when it stopped (a crash, a kill) are given back now rather
        // than when their leases run out.
        let now = chrono::Utc::now().timestamp_millis();
        match store
            .release_jobs_of(&format!("{}/", jobs.instance_id), now)
            .await
        {
            Ok(0) => {}
            Ok(released) => tracing::info!(released, "gave back the jobs this instance held"),
            Err(error) => tracing::warn!(%error, "cannot give back this instance's jobs"),
        }
        tokio::spawn({
            let store = store.clone();
            async move {
                match store.sweep_orphans().await {
                    Ok(0) => {}
                    Ok(rows) => tracing::info!(rows, "removed rows of deleted threads"),
                    Err(error) => tracing::warn!(%error, "cannot sweep rows of deleted threads"),
                }
            }
        });
        tracing::info!(summarizer = %summarizer.name(), workers, "starting job workers");
        let runners = (0..workers)
            .map(|_| Runner::new(store.clone(), summarizer.clone(), jobs.clone()))
            .collect();
        handles = crate::jobs::spawn_workers(runners, stop.clone(), abort.clone());
    }

    match listener {
        None => stop.cancelled().await,
        Some(listener) => {
            let connections = ConnectionLimits {
                max_connections: limits.max_connections,
                header_read_timeout: limits.header_read_timeout,
                write_timeout: limits.write_timeout,
            };
            let router = crate::http::router(AppState::new(store.clone(), limits, auth));
            tracing::info!(addr = %listener.local_addr()?, "listening");
            let server = serve(listener, router, connections, stop.clone());
            // In-flight requests finish; a request still running after the grace period is cut
            // off.
            tokio::select! {
                result = server => result.context("server error")?,
                _ = abort.cancelled() => {
                    tracing::warn!("grace period over; exiting with requests still in flight");
                }
            }
        }
    }
    // Workers stop claiming at once; a running job finishes, or is given back when the grace
    // period ends.
    for handle in handles {
        let _ = handle.await;
    }
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Bounds of the listener itself, before any request is parsed.
#[derive(Debug, Clone, Copy)]
struct ConnectionLimits {
    max_connections: usize,
    header_read_timeout: Duration,
    write_timeout: Duration,
}

/// Accepts connections until `stop`, each served by hyper's HTTP/1 connection with a header-read
/// timeout (a client that trickles its headers is disconnected) and a write timeout (a client
/// that stops reading an answer is disconnected), at most `max_connections` at once (past that,
/// new connections wait in the kernel's backlog). Each request carries its peer's address, for
/// the guard's count of failed authentications. After `stop`, every connection finishes its
/// request in flight and closes; this returns when all have.
async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    use axum::extract::connect_info::ConnectInfo;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt;

    let max = limits.max_connections.max(1);
    let open = Arc::new(tokio::sync::Semaphore::new(max));
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let with_peer = router.clone().map_request(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            },
        );
        let service = TowerToHyperService::new(with_peer);
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.write_timeout));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(Box::pin(stream)), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    return;
                }
                _ = stop.cancelled() => connection.as_mut().graceful_shutdown(),
            }
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Every connection gives its permit back when it closes.
    let _all = open.acquire_many(max as u32).await;
    Ok(())
}
