//! The accept loop: HTTP/1.1 connections served by hyper under limits a
//! slow or idle client cannot outlast, and a shutdown that always ends.
//!
//! `axum::serve` has no header timeout, no connection cap and waits for every
//! connection on shutdown, so a client sending a byte a second (or two hundred
//! idle keep-alive sockets) held the server's sockets for minutes and its
//! shutdown forever. Here each connection takes a permit from a semaphore of
//! [`ConnectionLimits::max_connections`] before it is accepted (beyond that,
//! new connections wait in the kernel's backlog while the open ones are
//! served); hyper's header-read timeout closes a connection whose request
//! head has not fully arrived in [`ConnectionLimits::header_timeout`], which
//! hyper counts from the moment the connection is ready for a request, so it
//! also closes idle keep-alive connections. Bodies have their own deadline
//! (read in [`crate::body`]). On shutdown the listener closes, idle
//! connections are closed, in-flight requests get
//! [`ConnectionLimits::shutdown_grace`] to finish, and then the loop returns
//! whatever is still open.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How many connections may be open and how long each phase may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once (`--max-connections`); more wait to be accepted.
    pub max_connections: usize,
    /// Time for a request's head to arrive, counted from when the connection
    /// is ready for it, so also the longest a keep-alive connection may idle
    /// (`--header-timeout`).
    pub header_timeout: Duration,
    /// Time for a request's whole body to arrive (`--body-timeout`, 408 after).
    pub body_timeout: Duration,
    /// Time in-flight requests get to finish after a shutdown signal
    /// (`--shutdown-grace`).
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains as the
/// module header describes and returns.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of file descriptors and the like: back off briefly
                    // rather than spin; the open connections keep going.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection error (timeout, reset) ends that connection only.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {}
    }
}
