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
        tracing::info!(summarizer = %summarizer.name(), workers, "starting job workers");
        let runners = (0..workers)
            .map(|_| Runner::new(store.clone(), summarizer.clone(), jobs.clone()))
            .collect();
        handles = crate::jobs::spawn_workers(runners, stop.clone(), abort.clone());
    }

    match listener {
        None => stop.cancelled().await,
        Some(listener) => {
            let router = crate::http::router(AppState::new(store.clone(), limits, auth));
            tracing::info!(addr = %listener.local_addr()?, "listening");
            let server = axum::serve(listener, router)
                .with_graceful_shutdown(stop.clone().cancelled_owned());
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
