//! The API reference page at `/docs`: served with the vendored Scalar bundle from the binary,
//! under a strict Content-Security-Policy, with nothing fetched from elsewhere. The browser test
//! renders it in headless Chromium (skipped, with the reason printed, when chromedriver is
//! missing, as the inspector's test in `ui.rs`).

use std::future::IntoFuture;

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use fantoccini::Locator;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use crate::common::{Backend, TestApp};
use crate::ui::{chromedriver, eventually, screenshot, start_browser};

/// The vendored bundle, read from the repository rather than from the library under test.
const VENDORED: &[u8] = include_bytes!("../../src/http/docs/scalar-api-reference.js");

/// A GET on the in-process service, with the raw body.
async fn fetch(
    app: &TestApp,
    uri: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let mut request = Request::builder().uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, body)
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(&name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// The strict policy and the companion headers every response of the docs routes carries.
fn assert_hardened(what: &str, headers: &HeaderMap) {
    let csp = header_str(headers, header::CONTENT_SECURITY_POLICY);
    let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
    for expected in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ] {
        assert!(
            directives.contains(&expected),
            "{what}: {expected:?} not in {csp:?}"
        );
    }
    let script_src = directives
        .iter()
        .find(|directive| directive.starts_with("script-src "))
        .unwrap();
    assert!(
        !script_src.contains("unsafe") && !script_src.contains("http") && !script_src.contains('*'),
        "{what}: script-src allows more than this origin: {script_src:?}"
    );
    assert!(!csp.contains("unsafe-eval"), "{what}: {csp:?}");
    assert_eq!(
        header_str(headers, header::X_CONTENT_TYPE_OPTIONS),
        "nosniff",
        "{what}"
    );
    assert_eq!(
        header_str(headers, header::REFERRER_POLICY),
        "no-referrer",
        "{what}"
    );
}

/// The value of the page's `data-configuration` attribute, parsed.
fn page_configuration(html: &str) -> Value {
    let start = html
        .find("data-configuration=\"")
        .unwrap_or_else(|| panic!("no data-configuration attribute: {html}"))
        + "data-configuration=\"".len();
    let end = start + html[start..].find('"').unwrap();
    let attribute = html[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&attribute).unwrap_or_else(|error| panic!("{error}: {attribute}"))
}

#[tokio::test]
async fn docs_page_loads_the_embedded_script_and_nothing_from_elsewhere() {
    let app = TestApp::new(Backend::Sqlite).await;
    let (status, headers, body) = fetch(&app, "/docs", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(header_str(&headers, header::CONTENT_TYPE).starts_with("text/html"));
    assert_hardened("/docs", &headers);
    let html = String::from_utf8(body).unwrap();
    assert!(html.contains("src=\"/docs/scalar.js"), "{html}");
    assert!(html.contains("data-url=\"/openapi.json\""), "{html}");
    // No CDN, no absolute URL of any kind: everything comes from this origin.
    assert!(
        !html.contains("http://") && !html.contains("https://") && !html.contains("src=\"//"),
        "{html}"
    );
    // No inline script: the policy would block it (the configuration is JSON data).
    for (at, _) in html.match_indices("<script") {
        let tag = &html[at..at + html[at..].find('>').unwrap()];
        assert!(
            tag.contains(" src=") || tag.contains("type=\"application/json\""),
            "an inline script: {tag}"
        );
    }
    app.finish().await;
}

#[tokio::test]
async fn docs_page_serves_the_vendored_bundle_byte_for_byte() {
    let app = TestApp::new(Backend::Sqlite).await;
    let (_, _, page) = fetch(&app, "/docs", &[]).await;
    let page = String::from_utf8(page).unwrap();
    let at = page.find("/docs/scalar.js").unwrap();
    let src = &page[at..at + page[at..].find('"').unwrap()];

    for uri in ["/docs/scalar.js", src] {
        let (status, headers, body) = fetch(&app, uri, &[]).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert_eq!(
            header_str(&headers, header::CONTENT_TYPE),
            "application/javascript; charset=utf-8"
        );
        assert_hardened(uri, &headers);
        assert!(
            body == VENDORED,
            "{uri}: not the vendored file ({} bytes)",
            body.len()
        );
        let cache = header_str(&headers, header::CACHE_CONTROL);
        assert!(cache.contains("max-age=31536000"), "{cache}");
        // A revalidation with the ETag is answered 304, with the same headers.
        let etag = header_str(&headers, header::ETAG).to_owned();
        let (status, headers, body) = fetch(&app, uri, &[("if-none-match", &etag)]).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{uri}");
        assert!(body.is_empty());
        assert_hardened(uri, &headers);
        assert_eq!(header_str(&headers, header::ETAG), etag);
    }
    app.finish().await;
}

/// The bundle loads nothing from a CDN by itself. It holds the addresses of Scalar's hosted
/// services as defaults of options (web fonts, a request proxy, developer tools, an agent): the
/// page's configuration turns each of them off.
#[tokio::test]
async fn docs_page_turns_off_the_bundles_hosted_defaults() {
    let bundle = String::from_utf8_lossy(VENDORED);
    for cdn in [
        "cdn.jsdelivr",
        "unpkg.com",
        "esm.sh",
        "cdnjs",
        "fonts.googleapis",
    ] {
        assert!(!bundle.contains(cdn), "the bundle refers to {cdn}");
    }
    let app = TestApp::new(Backend::Sqlite).await;
    let (_, _, page) = fetch(&app, "/docs", &[]).await;
    let config = page_configuration(&String::from_utf8(page).unwrap());
    assert_eq!(config["url"], "/openapi.json", "{config}");
    if bundle.contains("fonts.scalar.com") {
        assert_eq!(config["withDefaultFonts"], false, "{config}");
    }
    if bundle.contains("proxy.scalar.com") {
        // Absent (or empty): "try it" requests go straight to this origin.
        assert!(
            config
                .get("proxyUrl")
                .is_none_or(|proxy| proxy.as_str() == Some("")),
            "{config}"
        );
    }
    assert_eq!(config["telemetry"], false, "{config}");
    assert_eq!(config["showDeveloperTools"], "never", "{config}");
    assert_eq!(config["agent"]["disabled"], true, "{config}");
    assert_eq!(config["hideClientButton"], true, "{config}");
    app.finish().await;
}

/// Headless Chromium renders the reference from the embedded script under the page's policy: an
/// operation's summary from the document appears, every resource the page loaded is on this
/// origin, no web font is declared, and the policy is in force (an inline script does not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_page_renders_in_a_browser_under_its_policy() {
    let Some(chromedriver) = chromedriver() else {
        println!("SKIPPED the docs browser test: chromedriver is not installed (apt-get install chromium chromium-driver)");
        return;
    };
    let app = TestApp::new(Backend::Sqlite).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(axum::serve(listener, app.router.clone()).into_future());

    // What the page must show, as the document says it.
    let spec = app.get("/openapi.json").await.body;
    let summary = spec["paths"]["/v1/threads"]["post"]["summary"]
        .as_str()
        .expect("a summary of POST /v1/threads")
        .trim_end_matches('.')
        .to_owned();

    let profile =
        std::env::temp_dir().join(format!("loupe-docs-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&profile).unwrap();
    let (_driver, client) = start_browser(&chromedriver, &profile).await;
    let checks = async {
        client.goto(&format!("{base}/docs")).await.unwrap();
        eventually("the reference to show an operation", || async {
            let body = client.find(Locator::Css("body")).await.ok()?;
            body.text().await.ok()?.contains(&summary).then_some(())
        })
        .await;
        screenshot(&client, "docs-reference").await;

        let loaded = client
            .execute(
                "return performance.getEntriesByType('resource').map(entry => entry.name);",
                vec![],
            )
            .await
            .unwrap();
        let loaded: Vec<String> = serde_json::from_value(loaded).unwrap();
        assert!(
            loaded
                .iter()
                .any(|url| url.starts_with(&format!("{base}/docs/scalar.js"))),
            "{loaded:?}"
        );
        let elsewhere: Vec<&String> = loaded
            .iter()
            .filter(|url| !url.starts_with(&format!("{base}/")))
            .collect();
        assert!(elsewhere.is_empty(), "loaded from elsewhere: {elsewhere:?}");

        let styles = client
            .execute(
                "return Array.from(document.querySelectorAll('style, link[rel=stylesheet]'))
                    .map(node => node.textContent + ' ' + (node.href || '')).join('\\n');",
                vec![],
            )
            .await
            .unwrap();
        let styles = styles.as_str().unwrap();
        assert!(!styles.is_empty(), "Scalar injected no stylesheet");
        assert!(
            !styles.contains("fonts.scalar.com"),
            "the default web fonts are declared"
        );

        // The policy is in force: a script inserted into the page does not run.
        let inline = client
            .execute(
                "const script = document.createElement('script');
                 script.textContent = 'window.__inlineRan = true;';
                 document.body.appendChild(script);
                 return window.__inlineRan === true;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            inline,
            Value::Bool(false),
            "an inline script ran: no policy in force"
        );
    };
    checks.await;
    let _ = client.close().await;
    server.abort();
    let _ = std::fs::remove_dir_all(&profile);
    app.finish().await;
}
