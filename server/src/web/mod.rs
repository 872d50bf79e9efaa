//! The built-in web chat at `/`: one page, its script and its style, compiled into the binary
//! (`include_str!`: no build step, nothing fetched from anywhere else). The page talks to this
//! server's own `POST /v1/chat/completions` (streamed) and sends the API key, when the server has
//! one, as a bearer header; the page and its two assets hold nothing secret, so they are served
//! without the key (`is_public`) while every other route still needs it.

use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub const INDEX_HTML: &str = include_str!("index.html");
pub const CHAT_JS: &str = include_str!("chat.js");
pub const CHAT_CSS: &str = include_str!("chat.css");

/// The paths of the page and its assets (GET and HEAD only).
pub const PUBLIC_PATHS: [&str; 3] = ["/", "/web/chat.js", "/web/chat.css"];

/// The page may load its script, style and data: pictures from this server and talk to it; no
/// inline script, nothing from elsewhere, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Whether a request reaches the page or an asset, which need no key.
pub fn is_public(method: &Method, path: &str) -> bool {
    (method == Method::GET || method == Method::HEAD) && PUBLIC_PATHS.contains(&path)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // A newer binary serves a newer page: the browser asks again each time.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /`, `GET /web/chat.js`, `GET /web/chat.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/web/chat.js",
            get(|| async { asset("text/javascript; charset=utf-8", CHAT_JS) }),
        )
        .route(
            "/web/chat.css",
            get(|| async { asset("text/css; charset=utf-8", CHAT_CSS) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_its_assets_and_nothing_from_elsewhere() {
        for asset in &PUBLIC_PATHS[1..] {
            assert!(INDEX_HTML.contains(asset), "{asset}");
        }
        for text in [INDEX_HTML, CHAT_JS, CHAT_CSS] {
            for outside in ["http://", "https://", "//fonts.", "@import"] {
                assert!(!text.contains(outside), "{outside}");
            }
        }
        // Control: the check sees a URL where there is one.
        assert!("<script src=\"https://cdn\">".contains("https://"));
    }

    #[test]
    fn only_the_page_and_its_assets_are_public() {
        assert!(is_public(&Method::GET, "/"));
        assert!(is_public(&Method::HEAD, "/web/chat.js"));
        assert!(!is_public(&Method::POST, "/"));
        assert!(!is_public(&Method::GET, "/web/other.js"));
        assert!(!is_public(&Method::GET, "/v1/models"));
    }
}
