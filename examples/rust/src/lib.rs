//! The demo service: `GET /api/hello` behind the rate limiter of
//! [`rate_limit`] (the file to copy), `GET /healthz` outside it.

pub mod rate_limit;

use axum::{middleware, routing::get, Json, Router};
use serde_json::{json, Value};

use crate::rate_limit::{rate_limit, RateLimiter};

/// The routes. Serve with `into_make_service_with_connect_info::<SocketAddr>()`:
/// the middleware reads the peer address from it.
pub fn app(limiter: RateLimiter) -> Router {
    // Everything in this router is limited; routes merged from outside it
    // (health checks and the like) are not.
    let api = Router::new()
        .route("/api/hello", get(hello))
        .route_layer(middleware::from_fn_with_state(limiter, rate_limit));
    Router::new().merge(api).route("/healthz", get(healthz))
}

async fn hello() -> Json<Value> {
    Json(json!({"message": "hello"}))
}

async fn healthz() -> Json<Value> {
    Json(json!({"ok": true}))
}
