//! The accept loop: HTTP/1.1 connections served by hyper (through hyper-util) with a bound on
//! open connections and a timeout on request headers, and the shutdown: a first signal stops
//! accepting and lets running requests finish for up to a deadline, a second one stops at once.
//!
//! axum's own `serve` sets no header timeout and no bound, so this loop replaces it: each
//! connection is hyper's `http1::Builder` with `header_read_timeout` (a client that sends part
//! of its headers and stalls, or keeps an idle connection, is dropped when it runs out), and a
//! semaphore of `max_connections` permits (a connection beyond it gets a 503 in OpenAI's error
//! shape and is closed). Bodies have their own timeout where a handler reads them (a 408).

use super::metrics::Metrics;
use futures_util::{Stream, StreamExt};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// The server's bounds on its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request's headers must arrive within this (from the first byte, or from the end of the
    /// previous request on a kept-alive connection); else the connection is closed.
    pub header_timeout: Duration,
    /// A request's body must arrive within this once its handler reads it; else a 408.
    pub body_timeout: Duration,
    /// Connections open at most; beyond, a 503 and the connection is closed.
    pub max_connections: usize,
    /// After the first SIGINT/SIGTERM, running requests get this long to finish.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            drain: Duration::from_secs(30),
        }
    }
}

/// How serving ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every connection finished within the drain deadline.
    Drained,
    /// The deadline passed with this many connections still open.
    DeadlinePassed(usize),
    /// A second signal came with this many connections still open.
    Forced(usize),
}

/// Serves `app` on `listener` within `limits` until the first item of `signals`, then drains
/// (see [`Limits::drain`]); a second item ends it at once (the server's [`super::serve`]).
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    signals: impl Stream<Item = ()>,
) -> std::io::Result<Ended> {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut signals = std::pin::pin!(signals);
    loop {
        let (sock, _) = tokio::select! {
            _ = signals.next() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors (or a connection reset before accept): wait a
                    // little instead of spinning; the connections open will close.
                    eprintln!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(sock));
            continue;
        };
        let _ = sock.set_nodelay(true);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
        let conn = http.serve_connection(TokioIo::new(sock), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        let metrics = metrics.clone();
        metrics.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Errors here are the client's (it went away, or its headers timed out).
            let _ = conn.await;
            metrics.connections.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    let open = graceful.count();
    if open > 0 {
        eprintln!(
            "shutting down: {open} connection(s) finishing, at most {} s (a second signal stops at once)",
            limits.drain.as_secs_f64()
        );
    }
    let count = || metrics.connections.load(Ordering::Relaxed);
    Ok(tokio::select! {
        _ = graceful.shutdown() => Ended::Drained,
        _ = tokio::time::sleep(limits.drain) => Ended::DeadlinePassed(count()),
        _ = signals.next() => Ended::Forced(count()),
    })
}

/// Answers a connection beyond the bound with a 503 and closes it.
async fn refuse(mut sock: tokio::net::TcpStream) {
    let body = super::api::ApiError::internal("too many connections are open; try again later")
        .with_status(503)
        .body()
        .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(body.as_bytes()).await?;
        sock.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}

/// SIGINT (Ctrl-C) and SIGTERM, each time one comes.
pub fn signals() -> std::io::Result<impl Stream<Item = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let int = signal(SignalKind::interrupt())?;
        let term = signal(SignalKind::terminate())?;
        Ok(futures_util::stream::unfold((int, term), |(mut int, mut term)| async move {
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
            Some(((), (int, term)))
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(futures_util::stream::unfold((), |()| async {
            let _ = tokio::signal::ctrl_c().await;
            Some(((), ()))
        }))
    }
}
