//! `xdna-vl serve`: an OpenAI-compatible HTTP server over one engine.
//!
//! One model is loaded at start; requests wait first come first served in a bounded queue and run
//! on worker threads, one per engine handle (`queue`: one worker is one request at a time); the HTTP side (`routes`) reads
//! and checks requests (`api`), fetches their images (`media`) and streams answers as server-sent
//! events, through the path both APIs share (`answer`). Ollama's API (`ollama`) is served beside
//! OpenAI's, for clients that speak only Ollama. Errors are OpenAI-shaped, or Ollama-shaped on
//! Ollama's routes (`error`). `web` is the chat page served at `/`.

pub mod answer;
pub mod api;
pub mod chat;
pub mod client;
pub mod error;
pub mod media;
pub mod ollama;
pub mod queue;
pub mod routes;
pub mod think;
pub mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

pub use chat::{ChatEngine, ChatRequest, Completion, EngineError, Event, Finish, ModelInfo};
pub use media::MediaPolicy;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Checked as `Authorization: Bearer <key>` on every route but `/health` and the web chat's
    /// page and assets (the page asks for the key and sends it).
    pub api_key: Option<String>,
    pub media: MediaPolicy,
    /// The largest request body, in bytes (413 past it).
    pub body_limit: usize,
    /// The most tokens one request may generate (a request asking for more gets this many).
    pub max_tokens_cap: usize,
    /// Requests that may wait beside the running one (503 with Retry-After past it).
    pub queue_capacity: usize,
    /// One line on stderr per request that ran (`queue::request_line`).
    pub log_requests: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_key: None,
            media: MediaPolicy::default(),
            body_limit: 48 << 20,
            max_tokens_cap: 2048,
            queue_capacity: 16,
            log_requests: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish and returns. `ready` is
/// told the bound address (port 0 picks a free one). One engine: one request at a time.
pub fn serve_until<F>(
    options: ServeOptions,
    info: ModelInfo,
    engine: Box<dyn ChatEngine>,
    ready: impl FnOnce(SocketAddr),
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_workers_until(options, info, vec![engine], ready, shutdown)
}

/// [`serve_until`] with one worker per engine: as many requests run at once.
pub fn serve_workers_until<F>(
    options: ServeOptions,
    info: ModelInfo,
    engines: Vec<Box<dyn ChatEngine>>,
    ready: impl FnOnce(SocketAddr),
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (queue, workers) =
        queue::Queue::start(engines, options.queue_capacity, options.log_requests);
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(options.addr)
            .await
            .map_err(|source| ServeError::Bind {
                addr: options.addr,
                source,
            })?;
        ready(listener.local_addr()?);
        let state = Arc::new(routes::AppState {
            queue,
            info,
            api_key: options.api_key.clone(),
            media: options.media.clone(),
            body_limit: options.body_limit,
            max_tokens_cap: options.max_tokens_cap,
            next_id: AtomicU64::new(1),
        });
        axum::serve(listener, routes::router(state))
            .with_graceful_shutdown(shutdown)
            .await?;
        Ok(())
    });
    // The router (and with it the last queue sender) is gone: the workers finish and end.
    drop(runtime);
    for worker in workers {
        let _ = worker.join();
    }
    result
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serves until SIGINT or SIGTERM, one worker per engine.
pub fn serve(
    options: ServeOptions,
    info: ModelInfo,
    engines: Vec<Box<dyn ChatEngine>>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    serve_workers_until(options, info, engines, ready, shutdown_signal())
}
