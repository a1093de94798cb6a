//! The demo server, configured from the environment (see README.md):
//!
//!     VALKEY_ADDR=127.0.0.1:6379 PORT=8080 cargo run --release
//!     curl -i -H 'X-API-Key: demo' http://127.0.0.1:8080/api/hello

use std::net::SocketAddr;

use ratelimit_axum::app;
use ratelimit_axum::rate_limit::{RateLimitConfig, RateLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = RateLimitConfig::from_env()?;
    let port: u16 = std::env::var("PORT")
        .unwrap_or_else(|_| "8080".into())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    eprintln!(
        "listening on http://{}, Valkey at {}, failing {:?} on errors",
        listener.local_addr()?,
        config.valkey_addr,
        config.failure_mode
    );
    let limiter = RateLimiter::new(config)?;
    // ConnectInfo<SocketAddr> gives the middleware the peer address.
    axum::serve(
        listener,
        app(limiter).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
