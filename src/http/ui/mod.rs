//! The thread inspector: a page at `GET /ui` for people debugging an agent.
//!
//! The page is rendered here (maud) and its script and stylesheet are embedded in the binary:
//! nothing is fetched from elsewhere and nothing is built at run time. The page holds no data of
//! its own: its script reads every thread, history, context, outline, job, cursor and the
//! economics it charts (SVG drawn by the script) through the tenant API (`/v1/…`), so the guard,
//! the tenant scoping and the rate limit apply to it exactly as to any client. `/ui` and its
//! assets are public (see [`super::guard::access_of`]); in keyed mode the page asks for a key and
//! keeps it in the tab's `sessionStorage` only.
//!
//! These routes are not part of the API contract: they stay out of the OpenAPI document.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, DOCTYPE};

use super::AppState;
use crate::history::normalize::Provider;

const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// Stored content is rendered by the script as text, never as markup; the policy makes sure
/// nothing but the embedded script and stylesheet can run or load.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/assets/app.js", get(script))
        .route("/ui/assets/app.css", get(style))
}

/// The provider names the context panel offers, read from the `Provider` type's own schema so a
/// new provider appears without touching the page.
fn provider_names() -> Vec<String> {
    use utoipa::openapi::schema::Schema;
    use utoipa::openapi::RefOr;
    use utoipa::PartialSchema;

    let names = match Provider::schema() {
        RefOr::T(Schema::Object(object)) => object.enum_values.unwrap_or_default(),
        _ => Vec::new(),
    };
    let names: Vec<String> = names
        .iter()
        .filter_map(|value| value.as_str().map(str::to_owned))
        .collect();
    if names.is_empty() {
        // The schema is derived from the enum; this is only reached if its shape changes.
        vec![serde_json::to_value(Provider::default())
            .ok()
            .and_then(|value| value.as_str().map(str::to_owned))
            .unwrap_or_else(|| "anthropic".to_owned())]
    } else {
        names
    }
}

async fn page(State(state): State<AppState>) -> Response {
    let keyed = !state.guards.auth.is_open();
    let markup = render_page(keyed, &provider_names());
    (
        [
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        markup,
    )
        .into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The page's skeleton: the panels the script fills in.
fn render_page(keyed: bool, providers: &[String]) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Loupe inspector" }
                link rel="stylesheet" href="/ui/assets/app.css";
                script src="/ui/assets/app.js" defer {}
            }
            body data-mode=(if keyed { "keyed" } else { "open" }) {
                a class="skip" href="#thread" { "Skip to the thread" }
                header class="top" {
                    h1 { "Loupe inspector" }
                    p id="status" class="status" role="status" aria-live="polite" {}
                    @if keyed {
                        form id="key-form" class="key-form" {
                            label for="key-input" { "API key" }
                            input id="key-input" type="password" autocomplete="off"
                                placeholder="lp_…" required;
                            button type="submit" { "Use key" }
                            button type="button" id="key-forget" { "Forget key" }
                            small { "Kept in this tab only (sessionStorage)." }
                        }
                    }
                }
                div class="layout" {
                    nav id="threads" class="panel threads" aria-labelledby="threads-title" {
                        h2 id="threads-title" { "Threads" }
                        label for="thread-search" { "Search by id or metadata" }
                        input id="thread-search" type="search" autocomplete="off";
                        ul id="thread-list" class="thread-list" {}
                        button type="button" id="threads-more" hidden { "Load more threads" }
                    }
                    main id="thread" class="thread" tabindex="-1" {
                        h2 id="thread-title" { "No thread chosen" }
                        p id="thread-meta" class="muted" {}
                        p id="thread-lineage" class="muted" hidden {}
                        section id="economics" class="panel economics" aria-labelledby="economics-title" {
                            h3 id="economics-title" { "Context size and input cost, request by request" }
                            div class="economics-controls" {
                                label for="window-tokens" { "Model window (tokens)" }
                                input id="window-tokens" type="number" min="1000" max="10000000"
                                    step="1000" value="200000" inputmode="numeric";
                                label class="toggle" for="economics-fit" {
                                    input id="economics-fit" type="checkbox";
                                    " Scale the size chart to the requests"
                                }
                                span id="economics-summary" class="muted" {}
                            }
                            div class="charts" {
                                figure class="chart" {
                                    figcaption { "Context size per request" }
                                    div id="size-chart" class="chart-area" {}
                                    ul id="size-legend" class="legend" aria-label="Legend of the size chart" {}
                                }
                                figure class="chart" {
                                    figcaption { "Cumulative input cost (token-units at prompt-cache prices)" }
                                    div id="cost-chart" class="chart-area" {}
                                    ul id="cost-legend" class="legend" aria-label="Legend of the cost chart" {}
                                }
                            }
                        }
                        div class="columns" {
                            section id="history" class="panel" aria-labelledby="history-title" {
                                h3 id="history-title" { "History" }
                                div class="pager" {
                                    button type="button" id="page-first" { "First" }
                                    button type="button" id="page-prev" { "Earlier" }
                                    button type="button" id="page-next" { "Later" }
                                    button type="button" id="page-last" { "Latest" }
                                    label for="page-seq" { "From seq" }
                                    input id="page-seq" type="number" min="0" inputmode="numeric";
                                    span id="page-range" class="muted" {}
                                }
                                label class="toggle" for="hide-unsent" {
                                    input id="hide-unsent" type="checkbox" checked;
                                    " "
                                    span id="hide-unsent-label" { "Hide what no model sees" }
                                }
                                ol id="entries" class="entries" {}
                            }
                            section id="context" class="panel" aria-labelledby="context-title" {
                                h3 id="context-title" { "Context" }
                                label for="provider" { "Provider" }
                                select id="provider" {
                                    @for name in providers {
                                        option value=(name) { (name) }
                                    }
                                }
                                p id="context-summary" class="muted" {}
                                h4 { "Repairs" }
                                ol id="repairs" class="repairs" {}
                                h4 { "Messages" }
                                ol id="context-messages" class="context-messages" {}
                            }
                        }
                        div class="columns" {
                            section id="outline" class="panel" aria-labelledby="outline-title" {
                                h3 id="outline-title" { "Outline" }
                                p id="outline-status" class="muted" {}
                                ul id="outline-lines" class="outline" {}
                            }
                            section id="work" class="panel" aria-labelledby="work-title" {
                                h3 id="work-title" { "Jobs and cursors" }
                                h4 { "Jobs" }
                                table id="jobs" {
                                    thead { tr { th scope="col" { "kind" } th scope="col" { "state" } th scope="col" { "attempts" } th scope="col" { "last error" } } }
                                    tbody {}
                                }
                                h4 { "Cursors" }
                                table id="cursors" {
                                    thead { tr { th scope="col" { "name" } th scope="col" { "position" } th scope="col" { "new" } th scope="col" { "lease" } } }
                                    tbody {}
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_choice_comes_from_the_provider_type() {
        let names = provider_names();
        for provider in [Provider::Anthropic, Provider::Openai] {
            let name = serde_json::to_value(provider).unwrap();
            assert!(
                names.iter().any(|n| n == name.as_str().unwrap()),
                "{names:?}"
            );
        }
    }

    #[test]
    fn the_page_escapes_what_it_renders_and_asks_for_a_key_only_when_keyed() {
        let open = render_page(false, &["<x>".to_owned()]).into_string();
        assert!(open.contains("&lt;x&gt;"), "{open}");
        assert!(!open.contains("key-input"));
        let keyed = render_page(true, &[]).into_string();
        assert!(keyed.contains("id=\"key-input\""));
        assert!(keyed.contains("data-mode=\"keyed\""));
    }
}
