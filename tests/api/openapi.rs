//! The checked-in OpenAPI document is the one the code generates, and it is a sound 3.1 document.

use serde_json::Value;

const CHECKED_IN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
const REGENERATE: &str = "cargo run --quiet -- openapi > openapi/openapi.json";

fn generated() -> String {
    serde_json::to_string_pretty(&loupe::http::openapi()).unwrap() + "\n"
}

#[test]
fn the_checked_in_document_is_current() {
    let checked_in = std::fs::read_to_string(CHECKED_IN).unwrap_or_default();
    assert!(
        checked_in == generated(),
        "openapi/openapi.json is stale; regenerate it with `{REGENERATE}`"
    );
}

#[test]
fn the_document_parses_as_openapi_3_1() {
    let spec = oas3::from_json(generated()).expect("a valid OpenAPI 3.1 document");
    assert!(spec.openapi.starts_with("3.1"), "version {}", spec.openapi);
}

/// openapi-spec-validator, not a check of our own: it resolves every `$ref` and validates the
/// document against the OpenAPI 3.1 schema.
#[test]
fn an_independent_validator_accepts_the_checked_in_document() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/openapi-validate.sh");
    let output = std::process::Command::new(script)
        .arg(CHECKED_IN)
        .output()
        .expect("run scripts/openapi-validate.sh (needs python3)");
    assert!(
        output.status.success(),
        "openapi-spec-validator rejects openapi/openapi.json:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn every_operation_has_an_id_a_tag_and_its_error_responses() {
    let spec: Value = serde_json::from_str(&generated()).unwrap();
    let mut ids = std::collections::HashSet::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path}: no operationId"));
            assert!(ids.insert(id.to_owned()), "duplicate operationId {id}");
            assert!(
                operation["tags"]
                    .as_array()
                    .is_some_and(|tags| !tags.is_empty()),
                "{method} {path}: no tag"
            );
            let responses = operation["responses"].as_object().unwrap();
            if path.starts_with("/v1/") {
                let errors: Vec<&String> = responses
                    .keys()
                    .filter(|code| code.starts_with('4'))
                    .collect();
                assert!(
                    !errors.is_empty(),
                    "{method} {path}: no 4xx response documented"
                );
                for code in errors {
                    assert!(
                        responses[code]["content"]
                            .get("application/problem+json")
                            .is_some(),
                        "{method} {path} {code}: not a problem+json response"
                    );
                }
            }
        }
    }
    assert!(!ids.is_empty());
}

#[tokio::test]
async fn the_service_serves_its_document_and_a_docs_page() {
    let app = crate::common::TestApp::new(crate::common::Backend::Sqlite).await;
    let served = app.get("/openapi.json").await;
    assert_eq!(served.status, axum::http::StatusCode::OK);
    let generated: Value = serde_json::from_str(&generated()).unwrap();
    assert_eq!(served.body, generated);
    let docs = app.get("/docs").await;
    assert_eq!(docs.status, axum::http::StatusCode::OK);
    let html = docs.body.as_str().expect("an HTML page");
    assert!(html.contains("<html"), "{html:.200}");
    // Scalar embeds the document in the page.
    assert!(
        html.contains("Loupe") && html.contains("openapi"),
        "{html:.200}"
    );
    app.finish().await;
}

/// Writes the generated document over the checked-in one: `cargo test --test api -- --ignored
/// write_openapi` regenerates it from the test build, without a second build of the binary.
#[test]
#[ignore = "writes openapi/openapi.json; run on purpose"]
fn write_openapi() {
    std::fs::write(CHECKED_IN, generated()).unwrap();
}

/// The rules that tie members together, which JSON Schema cannot state, are stated in words
/// where a client generated from the document shows them: the members' descriptions.
#[test]
fn the_document_states_the_rules_a_schema_cannot() {
    let document = loupe::http::openapi();
    let schemas = &document["components"]["schemas"];
    let description = |pointer: &str| {
        schemas
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no description at {pointer}"))
            .to_owned()
    };
    for (pointer, rule) in [
        (
            "/OutlineBody/properties/budget_bytes/description",
            "4 × `line_bytes`",
        ),
        ("/OutlineBody/description", "4 × `line_bytes`"),
        (
            "/ThreadSettingsBody/description",
            "`outline.budget_bytes` ≥ 4 × `outline.line_bytes`",
        ),
        (
            "/AppendMessagesRequest/properties/messages/description",
            "unique",
        ),
        (
            "/ClaimRequest/properties/limit/description",
            "query's `limit`",
        ),
        (
            "/SnipRequest/properties/seqs/description",
            "at least one message",
        ),
        (
            "/SnipRequest/properties/seqs/description",
            "`no-such-message`",
        ),
    ] {
        let text = description(pointer);
        assert!(
            text.contains(rule),
            "{pointer}: {text:?} does not say {rule:?}"
        );
    }
}

/// The two token counts of a context answer say which is for what, each naming the other.
#[test]
fn the_document_says_which_token_count_to_use() {
    let document = loupe::http::openapi();
    let schemas = &document["components"]["schemas"];
    let estimated = schemas["Normalized"]["properties"]["estimated_tokens"]["description"]
        .as_str()
        .unwrap();
    assert!(estimated.contains("`context_tokens`"), "{estimated}");
    assert!(estimated.contains("characters / 4"), "{estimated}");
    let context = schemas["ContextResponse"]["allOf"][1]["properties"]["context_tokens"]
        ["description"]
        .as_str()
        .unwrap();
    assert!(context.contains("`estimated_tokens`"), "{context}");
    assert!(context.contains("budget by"), "{context}");
    let readme = include_str!("../../README.md");
    assert!(readme.contains("Which token count to use"));
}

/// The transcript import and export offer JSON beside JSON Lines, an array of the entries the
/// lines hold, so that generated clients type both operations.
#[test]
fn import_and_export_offer_a_json_array_of_entries() {
    let document = loupe::http::openapi();
    let path = |p: &str| &document["paths"][p];
    let import = &path("/v1/threads/{thread_id}/import")["post"]["requestBody"]["content"];
    let export = &path("/v1/threads/{thread_id}/export")["get"]["responses"]["200"]["content"];
    for content in [import, export] {
        assert!(content["application/x-ndjson"].is_object(), "{content}");
        let array = &content["application/json"]["schema"];
        assert_eq!(array["type"], "array", "{content}");
        assert_eq!(
            array["items"]["$ref"], "#/components/schemas/Entry",
            "{content}"
        );
    }
}
