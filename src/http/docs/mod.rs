//! The API reference: a page at `GET /docs` that renders `/openapi.json` with Scalar.
//!
//! Scalar's standalone browser bundle is vendored next to this file (`scalar-api-reference.js`;
//! `README.md` says which release it is and how to update it) and embedded in the binary: the
//! page loads nothing from elsewhere, works without internet access, and a change to a package
//! published elsewhere cannot change the script that runs on the API's origin. The page's
//! configuration turns off what would call out (the default web fonts, telemetry, the request
//! proxy, the agent, the developer tools), and a strict Content-Security-Policy makes sure that
//! only the embedded script runs and that the page only talks to this origin.
//!
//! These routes are public (see [`super::guard::access_of`]) and are not part of the API
//! contract: they stay out of the OpenAPI document.

use std::sync::LazyLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, DOCTYPE};
use sha2::{Digest, Sha256};

use super::AppState;

/// Scalar's standalone browser bundle, byte for byte as published (see `README.md`).
pub const SCRIPT: &[u8] = include_bytes!("scalar-api-reference.js");

/// Where the page loads the bundle from.
pub const SCRIPT_PATH: &str = "/docs/scalar.js";

/// Only the embedded script runs (no inline script, no `eval`), and the page reaches nothing but
/// this origin. Scalar injects its stylesheet at run time and sets inline styles, hence
/// `'unsafe-inline'` for styles only; its icons and images are inline `data:` URLs.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    connect-src 'self'; img-src 'self' data:; font-src 'self' data:; \
    style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The bundle's SHA-256, hex: its ETag, and the version in the page's link to it, so the script
/// can be cached for good and a new bundle still reaches the browser at once.
static SCRIPT_SHA256: LazyLock<String> = LazyLock::new(|| hex::encode(Sha256::digest(SCRIPT)));

/// The bundle's ETag: its SHA-256, quoted.
static SCRIPT_ETAG: LazyLock<String> = LazyLock::new(|| format!("\"{}\"", *SCRIPT_SHA256));

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/docs", get(page))
        .route(SCRIPT_PATH, get(script))
        .layer(middleware::map_response(harden))
}

/// Scalar's configuration (the options of its standalone bundle): the document, and everything
/// that would fetch from elsewhere turned off. No `proxyUrl`: "try it" requests go straight to
/// this origin.
pub fn configuration() -> serde_json::Value {
    serde_json::json!({
        "url": "/openapi.json",
        // The default fonts are web fonts from Scalar's servers; the page uses the system's.
        "withDefaultFonts": false,
        "telemetry": false,
        // The client button opens Scalar's hosted client.
        "hideClientButton": true,
        // The developer tools (shown on localhost) link to Scalar's hosted services.
        "showDeveloperTools": "never",
        "agent": { "disabled": true },
        "mcp": { "disabled": true },
    })
}

/// The headers every response of these routes carries, whatever it is.
async fn harden(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

async fn page() -> Response {
    ([(header::CACHE_CONTROL, "no-cache")], render_page()).into_response()
}

/// The bundle. Its link in the page carries its digest, so it may be cached for a year; a
/// revalidation with the ETag is answered 304.
async fn script(headers: HeaderMap) -> Response {
    let etag = SCRIPT_ETAG.as_str();
    let cache = [
        (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        (header::ETAG, etag),
    ];
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*");
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        cache,
        [(
            header::CONTENT_TYPE,
            "application/javascript; charset=utf-8",
        )],
        SCRIPT,
    )
        .into_response()
}

/// The page: Scalar reads its configuration from the `#api-reference` element (JSON data, not a
/// script) and mounts itself in front of it.
fn render_page() -> Markup {
    let script = format!("{SCRIPT_PATH}?v={}", &SCRIPT_SHA256[..16]);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Loupe API reference" }
            }
            body {
                noscript {
                    p {
                        "The Loupe API reference needs JavaScript. The OpenAPI document is at "
                        a href="/openapi.json" { "/openapi.json" }
                        "."
                    }
                }
                script id="api-reference" type="application/json" data-url="/openapi.json"
                    data-configuration=(configuration().to_string()) {}
                script src=(script) {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README names the file's digest, so a maintainer can check what is vendored.
    #[test]
    fn docs_page_readme_names_the_vendored_bundle_digest() {
        let readme = include_str!("README.md");
        assert!(
            readme.contains(SCRIPT_SHA256.as_str()),
            "README.md does not name the bundle's sha256 {}",
            *SCRIPT_SHA256
        );
    }

    #[test]
    fn docs_page_configuration_turns_off_what_calls_out() {
        let config = configuration();
        assert_eq!(config["url"], "/openapi.json");
        assert_eq!(config["withDefaultFonts"], false);
        assert_eq!(config["telemetry"], false);
        assert_eq!(config["hideClientButton"], true);
        assert_eq!(config["showDeveloperTools"], "never");
        assert_eq!(config["agent"]["disabled"], true);
        assert_eq!(config["mcp"]["disabled"], true);
        assert!(config.get("proxyUrl").is_none() && config.get("proxy").is_none());
    }
}
