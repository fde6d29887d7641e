//! The web console at `/`: one page, its HTML, JS and CSS inside the binary (no CDN; it
//! works offline), over the same API. The files ask for no login; the API calls they make
//! do. See `console/console.js` for what it shows and how often it asks.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The files change only with the binary: a browser may keep them an hour.
const CACHE: &str = "public, max-age=3600";

/// `GET /`.
pub async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}

/// `GET /console.js`.
pub async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, CACHE),
        ],
        SCRIPT,
    )
}

/// `GET /console.css`.
pub async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, CACHE),
        ],
        STYLE,
    )
}
