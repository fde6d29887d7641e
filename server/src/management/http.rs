//! The HTTP side: accepts connections, plain or TLS (`--management-tls`), and serves each
//! with hyper's HTTP/1.1 (keep-alive), bounded as the AMQP side bounds frames: at most
//! [`MAX_HEADERS`] headers in [`MAX_HEAD_BYTES`], the head read within [`HEAD_TIME`], a
//! body of at most [`MAX_BODY_BYTES`], and a whole request within
//! [`REQUEST_TIME`](super::reply::REQUEST_TIME).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tower::ServiceExt as _;

use super::auth::Peer;
use super::Management;
use crate::tls::Tls;

/// The most headers a request may have.
pub const MAX_HEADERS: usize = 64;

/// The most bytes a request's head may take.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a client may take to send a request's head.
pub const HEAD_TIME: Duration = Duration::from_secs(10);

/// The largest request body (a definitions import, a publish of a large message, base64).
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// Serves the management API of `state` on `listener` until the future is dropped; over
/// TLS with `tls`.
pub async fn serve(listener: TcpListener, state: Arc<Management>, tls: Option<Arc<Tls>>) {
    let router = super::router(Arc::clone(&state)).layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let clock = state.settings.clock.clone();
    tokio::spawn(Arc::clone(&state.rates).run(state.broker.clone(), clock));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "management: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let acceptor = tls.as_ref().map(|tls| tls.acceptor());
        tokio::spawn(async move {
            match acceptor {
                None => connection(stream, router, Peer(peer)).await,
                Some(acceptor) => {
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(HEAD_TIME, acceptor.accept(stream)).await
                    {
                        connection(stream, router, Peer(peer)).await;
                    }
                }
            }
        });
    }
}

/// Serves one connection's requests until it closes.
async fn connection(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    router: Router,
    peer: Peer,
) {
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(peer);
        router.clone().oneshot(request.map(axum::body::Body::new))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIME)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES);
    if let Err(e) = http.serve_connection(TokioIo::new(stream), service).await {
        tracing::debug!(error = %e, peer = %peer.0, "management connection ended");
    }
}
