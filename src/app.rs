//! The running service, apart from its command line: the HTTP API and the job workers over one
//! store, until a shutdown signal. `cli::serve` builds an [`App`] from flags; tests build one
//! directly and drive the shutdown themselves.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod slow_reader;

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

    // Erasures whose scrub a stop cut short: their text may still be in the files.
    match store.resume_scrubs().await {
        Ok(0) => {}
        Ok(queued) => tracing::info!(queued, "scrubbing after erasures a stop cut short"),
        Err(error) => tracing::warn!(%error, "cannot read the erasures left to scrub"),
    }

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
        handles.push(crate::jobs::retention::spawn_retention_sweeper(
            store.clone(),
            jobs.retention_sweep,
            stop.clone(),
        ));
        handles.push(crate::webhooks::spawn_sender(
            store.clone(),
            crate::webhooks::WebhookConfig {
                allow_private: limits.webhooks_allow_private,
                ..crate::webhooks::WebhookConfig::DEFAULT
            },
            stop.clone(),
        ));
        handles.push(crate::jobs::spawn_indexer(
            store.clone(),
            jobs.poll_interval,
            stop.clone(),
        ));
    }

    match listener {
        None => stop.cancelled().await,
        Some(listener) => {
            let connections = ConnectionLimits {
                max_connections: limits.max_connections,
                max_connections_per_address: limits.max_connections_per_address,
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
    /// Of those, how many one peer address (an IPv6 /64) may hold; 0 for no limit.
    max_connections_per_address: usize,
    header_read_timeout: Duration,
    write_timeout: Duration,
}

/// How many connections each peer address holds, within a share.
#[derive(Clone)]
struct PerAddress {
    share: usize,
    held: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in its address's share, given back when dropped.
struct AddressPlace {
    address: IpAddr,
    held: Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>,
}

impl PerAddress {
    fn new(share: usize) -> Self {
        PerAddress {
            share,
            held: Arc::default(),
        }
    }

    /// A place for a connection from `peer`, unless its address holds its share. IPv6 peers are
    /// counted by their /64, which one host usually holds whole.
    fn enter(&self, peer: IpAddr) -> Option<Option<AddressPlace>> {
        if self.share == 0 {
            return Some(None);
        }
        let address = match peer {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let prefix = u128::from(v6) & !((1_u128 << 64) - 1);
                    IpAddr::V6(std::net::Ipv6Addr::from(prefix))
                }
            },
            v4 => v4,
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(address).or_insert(0);
        if *count >= self.share {
            return None;
        }
        *count += 1;
        Some(Some(AddressPlace {
            address,
            held: self.held.clone(),
        }))
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.address);
            }
        }
    }
}

/// Accepts connections until `stop`, each served by hyper's HTTP/1 connection with a header-read
/// timeout (a client that trickles its headers is disconnected), a write timeout (a client
/// that stops reading an answer is disconnected) and a floor on the rate a client with more to
/// take must read at (`slow_reader`), at most `max_connections` at once (past that,
/// new connections wait in the kernel's backlog), of which one peer address may hold
/// `max_connections_per_address` (past that, its new connections are closed as they come, so one
/// address's idle connections cannot fill the listener for everyone else). Each request carries
/// its peer's address, for the guard's count of failed authentications. After `stop`, every connection finishes its
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
    let per_address = PerAddress::new(limits.max_connections_per_address);
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
        let Some(held) = per_address.enter(peer.ip()) else {
            tracing::debug!(%peer, "closing a connection past its address's share");
            drop(stream);
            continue;
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
        let stream = slow_reader::SlowReaderCut::new(Box::pin(stream), limits.write_timeout);
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = (permit, held);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A connection's answer to a plain `GET /`: its status line, or "" when it was closed first.
    fn status_line(stream: &mut std::net::TcpStream) -> String {
        let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let mut buffer = [0; 64];
        let n = stream.read(&mut buffer).unwrap_or(0);
        String::from_utf8_lossy(&buffer[..n])
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// One address's idle connections hold at most its share: past it, its new connections are
    /// closed as they come, and a place freed is free again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_address_holds_at_most_its_share_of_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = ConnectionLimits {
            max_connections: 10,
            max_connections_per_address: 2,
            header_read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
        };
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, router, limits, stop.clone()));
        let outcome = tokio::task::spawn_blocking(move || {
            let connect = || {
                let stream = std::net::TcpStream::connect(addr).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                stream
            };
            let (mut first, mut second) = (connect(), connect());
            let third = status_line(&mut connect());
            let kept = (status_line(&mut first), status_line(&mut second));
            drop(first);
            // The freed place is given back when the server sees the connection close.
            let mut again = String::new();
            for _ in 0..100 {
                again = status_line(&mut connect());
                if !again.is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (third, kept, again)
        })
        .await
        .unwrap();
        let (third, (first, second), again) = outcome;
        assert_eq!(third, "", "the third connection was served");
        assert!(first.starts_with("HTTP/1.1 200"), "{first:?}");
        assert!(second.starts_with("HTTP/1.1 200"), "{second:?}");
        assert!(again.starts_with("HTTP/1.1 200"), "{again:?}");
        stop.cancel();
        server.await.unwrap().unwrap();
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64_and_a_mapped_v4_as_itself() {
        let per = PerAddress::new(1);
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let held = per.enter(a).unwrap();
        assert!(per.enter(b).is_none(), "the same /64");
        assert!(per.enter(other).unwrap().is_some());
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let _mapped = per.enter(mapped).unwrap();
        assert!(per.enter(v4).is_none(), "a mapped address is its IPv4 one");
        drop(held);
        assert!(per.enter(b).unwrap().is_some());
    }
}
