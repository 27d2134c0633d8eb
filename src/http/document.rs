//! The OpenAPI document: what utoipa derives from the handlers' annotations, completed with what
//! the annotations cannot say. The security schemes and the answers of the authentication
//! middleware (`document_security`, derived from the rule the middleware enforces), the
//! answers that middleware and extractors give on every operation, the problem `type` as an
//! enum, and the rules of the history format, which JSON Schema states with `if`/`then` and
//! `anyOf` (keywords utoipa has no builder for).

use serde_json::{json, Value};

use super::guard;
use super::problem::ProblemKind;
use crate::history::ingest::MAX_UUID_LEN;

/// The finished document, as served and checked in.
pub fn complete(openapi: &utoipa::openapi::OpenApi) -> Value {
    let mut document = serde_json::to_value(openapi).expect("the OpenAPI document serializes");
    describe_consistency(&mut document);
    add_shared_answers(&mut document);
    describe_problem(&mut document);
    add_history_rules(&mut document);
    describe_token_counts(&mut document);
    open_free_form_objects(&mut document);
    document
}

/// Declares the `bearer` (tenant key) and `admin` schemes and puts them on the operations that
/// need them, with their 401/403/429 answers. Derived from [`guard::access_of`], the rule the
/// middleware enforces, so the document cannot drift from it.
pub(super) fn document_security(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{
        HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("lp_<prefix>_<secret>")
                .description(Some(
                    "A tenant's API key. Not needed in open mode (no keys configured).",
                ))
                .build(),
        ),
    );
    components.add_security_scheme(
        "admin",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The admin key, `LOUPE_ADMIN_KEY`."))
                .build(),
        ),
    );
    let problem = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build(),
        )
    };
    for (path, item) in openapi.paths.paths.iter_mut() {
        let (scheme, extra): (&str, Vec<(&str, &str)>) = match guard::access_of(path) {
            guard::Access::Public => continue,
            guard::Access::Tenant => (
                "bearer",
                vec![
                    (
                        "401",
                        "No valid API key (`unauthorized`); `WWW-Authenticate: Bearer`",
                    ),
                    ("403", "The admin key on a tenant endpoint (`forbidden`)"),
                    (
                        "421",
                        "Open mode only: the request names a `Host` that is neither loopback's nor in `--allowed-hosts` (`host-not-allowed`)",
                    ),
                    (
                        "429",
                        "The tenant's rate limit is exhausted or this address failed to authenticate too often (`rate-limited`), or the tenant has as many requests in flight as its share allows (`too-many-in-flight`); see `Retry-After`",
                    ),
                ],
            ),
            guard::Access::Admin | guard::Access::Metrics => (
                "admin",
                vec![
                    (
                        "401",
                        "No valid admin key (`unauthorized`); `WWW-Authenticate: Bearer`",
                    ),
                    (
                        "403",
                        "A tenant's key, or the admin API is off (`forbidden`)",
                    ),
                ],
            ),
        };
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            let responses = &mut operation.responses.responses;
            // Every route reads its body within the body-read timeout, and every route that
            // reaches the database answers 503 `unavailable` when it cannot.
            let has_body = operation.request_body.is_some();
            if has_body {
                responses.entry("408".to_owned()).or_insert_with(|| {
                    problem("The body did not arrive within the body-read timeout (`body-timeout`)")
                });
            }
            match responses.get_mut("503") {
                Some(RefOr::T(response)) => {
                    response.description.push_str(
                        "; or the database is unavailable (`unavailable`); see `Retry-After`",
                    );
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    responses.insert(
                        "503".to_owned(),
                        problem("The database is unavailable (`unavailable`); see `Retry-After`"),
                    );
                }
            }
            // An import streams its body in pieces instead (`transcripts`).
            if has_body && !path.ends_with("/import") {
                if let Some(RefOr::T(response)) = responses.get_mut("503") {
                    response.description.push_str(
                        "; or the request bodies held in memory fill the server's budget (`overloaded`)",
                    );
                }
            }
            operation.security = Some(vec![SecurityRequirement::new(scheme, Vec::<String>::new())]);
            for (status, description) in &extra {
                operation
                    .responses
                    .responses
                    .entry((*status).to_owned())
                    .or_insert_with(|| problem(description));
            }
        }
    }
}

/// The node at `pointer`; the document's shape is fixed by the code, so a miss is a bug.
fn at<'a>(document: &'a mut Value, pointer: &str) -> &'a mut Value {
    document
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("the OpenAPI document has no {pointer}"))
}

fn problem_answer(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

/// Answers any operation can give whatever its handler does: the JSON extractor's (a body that is
/// malformed, too large, not JSON or of the wrong shape), a malformed query or path parameter,
/// and the request timeout or a busy database. An operation's own description of a status wins.
fn add_shared_answers(document: &mut Value) {
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
    {
        if operation.get("responses").is_none() {
            continue;
        }
        let has_body = operation.get("requestBody").is_some();
        let has_parameters = operation
            .get("parameters")
            .and_then(Value::as_array)
            .is_some_and(|parameters| !parameters.is_empty());
        let mut shared = Vec::new();
        if has_body {
            shared.extend([
                ("400", "Malformed JSON (`bad-request`)"),
                ("413", "The body is over the size limit (`payload-too-large`)"),
                (
                    "415",
                    "The body is not `application/json` (`unsupported-media-type`)",
                ),
                (
                    "422",
                    "A value the schema allows but the server refuses (`validation`); `errors[].field` names it",
                ),
            ]);
        }
        if has_parameters {
            shared.push(("400", "A malformed parameter (`bad-request`)"));
        }
        shared.push((
            "503",
            "The request timed out (`timeout`), the database is busy (`unavailable`) or the \
             service is overloaded (`overloaded`); retry later",
        ));
        let responses = at(operation, "/responses")
            .as_object_mut()
            .expect("responses are an object");
        for (status, description) in shared {
            responses
                .entry(status)
                .or_insert_with(|| problem_answer(description));
        }
        let mut sorted: Vec<(String, Value)> = std::mem::take(responses).into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        responses.extend(sorted);
    }
}

/// `Problem`, with `type` an enum of every kind so that clients can switch on it, and the
/// extension members allowed.
fn describe_problem(document: &mut Value) {
    let types: Vec<String> = ProblemKind::ALL.iter().map(|k| k.type_uri()).collect();
    *at(document, "/components/schemas/Problem") = json!({
        "type": "object",
        "description": "A problem details document (RFC 9457). Extension members: `request_id`, \
            `errors` (field errors), `next_seq` (seq conflicts), `retry_after`, …",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {
                "type": "string",
                "description": "Stable machine-readable kind: `urn:loupe:problem:<kind>`.",
                "enum": types,
            },
            "title": {"type": "string"},
            "status": {"type": "integer", "format": "int32", "minimum": 400, "maximum": 599},
            "detail": {"type": "string"},
            "request_id": {"type": "string"},
        },
        "additionalProperties": true,
        "example": {
            "type": "urn:loupe:problem:not-found",
            "title": "Not found",
            "status": 404,
            "detail": "thread not found",
            "request_id": "0b6c1b3e-8c39-4c67-9f0e-4d2b5d2e8f10"
        }
    });
}

/// A tool name as the providers accept it (`http::context::valid_tool_name`).
const TOOL_NAME_PATTERN: &str = "^[A-Za-z0-9_-]{1,64}$";

/// The rules `history::ingest::check_entry` and the handlers enforce beyond field types.
fn add_history_rules(document: &mut Value) {
    let message_with_role = |role: &str| {
        json!({
            "required": ["message"],
            "properties": {"message": {"type": "object", "properties": {"role": {"const": role}}}}
        })
    };
    let rules = [
        json!({
            "if": {"properties": {"type": {"enum": ["user", "attachment"]}}},
            "then": message_with_role("user"),
        }),
        json!({
            "if": {"properties": {"type": {"const": "assistant"}}},
            "then": message_with_role("assistant"),
        }),
        json!({
            "if": {"properties": {"type": {"const": "system"}}},
            "then": {"required": ["subtype"], "properties": {"subtype": {"type": "string", "minLength": 1}}},
        }),
        json!({
            "if": {
                "properties": {"type": {"const": "system"}, "subtype": {"const": "snip"}},
                "required": ["subtype"],
            },
            "then": {"required": ["snip_metadata"], "properties": {"snip_metadata": {"type": "object"}}},
        }),
    ];
    at(document, "/components/schemas/Entry/allOf")
        .as_array_mut()
        .expect("Entry is an allOf")
        .extend(rules);
    *at(document, "/components/schemas/Content/oneOf/1/items") = json!({
        "type": "object",
        "description": "A content block: an object with a non-empty `type`; other members are kept verbatim.",
        "required": ["type"],
        "properties": {"type": {"type": "string", "minLength": 1}},
        "additionalProperties": true,
    });
    *at(
        document,
        "/components/schemas/SnipMetadata/properties/removed_uuids/items",
    ) = json!({
        "type": "string",
        "maxLength": MAX_UUID_LEN,
        "pattern": r"^[^\u0000]*$",
    });
    *at(
        document,
        "/components/schemas/SnipRequest/properties/uuids/items",
    ) = json!({
        "type": "string",
        "maxLength": MAX_UUID_LEN,
        "pattern": r"^[^\u0000]*$",
    });
    // A snip names at least one message: with no seq named, a uuid must be. Said with if/then
    // rather than anyOf, which generators turn into a union of two partial models.
    let snip = at(document, "/components/schemas/SnipRequest")
        .as_object_mut()
        .expect("SnipRequest is an object");
    snip.insert(
        "if".to_owned(),
        json!({"properties": {"seqs": {"maxItems": 0}}}),
    );
    snip.insert(
        "then".to_owned(),
        json!({"required": ["uuids"], "properties": {"uuids": {"minItems": 1}}}),
    );
    *at(
        document,
        "/components/schemas/ErasureRequestBody/properties/uuids/items",
    ) = json!({
        "type": "string",
        "maxLength": MAX_UUID_LEN,
        "pattern": r"^[^\u0000]*$",
    });
    // An erasure names at least one entry, by uuids, seqs or both (null or absent lists are empty).
    let erasure = at(document, "/components/schemas/ErasureRequestBody")
        .as_object_mut()
        .expect("ErasureRequestBody is an object");
    erasure.insert(
        "if".to_owned(),
        json!({"properties": {"seqs": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}}),
    );
    erasure.insert(
        "then".to_owned(),
        json!({"required": ["uuids"], "properties": {"uuids": {"type": "array", "minItems": 1}}}),
    );
    for list in [
        "/components/schemas/NormalizeRequest/properties/tools/items",
        "/components/schemas/MicrocompactBody/properties/tools/items",
    ] {
        at(document, list)
            .as_object_mut()
            .expect("tool names are strings")
            .insert("pattern".to_owned(), TOOL_NAME_PATTERN.into());
    }
}

/// What `estimated_tokens` is for, beside the context's `context_tokens`: the two read as the
/// same thing and differ by a factor of 2–3 on real sessions. (`Normalized`, whose member it is,
/// lives with the normalizer, whose doc comment names the function rather than the use.)
fn describe_token_counts(document: &mut Value) {
    *at(
        document,
        "/components/schemas/Normalized/properties/estimated_tokens/description",
    ) = json!(
        "A rough, provider-independent size of `messages` alone: their characters / 4 (images and \
         documents 2,000 each), the reference's estimate. It counts no system prompt, no tool \
         definitions and no tokenizer, so on real sessions it reads 2–3 times below what the \
         provider counts. Use it to compare answers with each other (how much a snip, \
         micro-compaction or clearing saved); to decide whether a request fits the model's \
         window or when to compact, use a thread context's `context_tokens`."
    );
}

/// The consistency token (`docs/SCALING.md`): the `Loupe-LSN` header on the answers of every
/// write, and `min_lsn` (or the same header) on every read a standby may serve. One list each, in
/// `consistency`, so the document and the handlers name the same operations.
fn describe_consistency(document: &mut Value) {
    let token_schema =
        json!({"type": "string", "pattern": super::consistency::LSN_PATTERN, "maxLength": 17});
    let read_description = "A write's consistency token (its `Loupe-LSN` header or `lsn`): the \
        read sees that write. A read standby serves it once it has replayed the write, else the \
        primary does, after a bounded wait. The same token may come as the request header \
        `Loupe-LSN` instead (the later of the two counts). Without standbys every read sees \
        every write.";
    let write_header = json!({
        "description": "The write's consistency token, also the body's `lsn` where it has one: \
            send it back with a read (`Loupe-LSN` or `min_lsn`) to see this write on a read \
            standby. Present only where the service reads from standbys.",
        "schema": token_schema,
    });
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    let mut seen = Vec::new();
    for (path, method, operation) in paths
        .iter_mut()
        .filter_map(|(path, item)| Some((path, item.as_object_mut()?)))
        .flat_map(|(path, item)| item.iter_mut().map(move |(method, op)| (path, method, op)))
        .filter_map(|(path, method, op)| Some((path, method, op.as_object_mut()?)))
    {
        let id = operation
            .get("operationId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        seen.push(id.clone());
        // A change to what routed reads show must answer a token, or a read may miss it.
        let changes_reads = method != "get"
            && (path.starts_with("/v1/threads") || path.starts_with("/v1/retention"));
        assert!(
            !changes_reads
                || super::consistency::TOKEN_WRITES.contains(&id.as_str())
                || super::consistency::ROUTED_READS.contains(&id.as_str()),
            "{method} {path} ({id}) is neither a token write nor a routed read"
        );
        if super::consistency::ROUTED_READS.contains(&id.as_str()) {
            let parameters = operation
                .entry("parameters")
                .or_insert_with(|| json!([]))
                .as_array_mut()
                .expect("parameters are an array");
            // The header is described here rather than declared: generators and fuzzers give
            // header parameters values of their own, ignoring the pattern.
            parameters.push(json!({
                "name": "min_lsn", "in": "query", "required": false,
                "description": read_description, "schema": token_schema,
            }));
        }
        if super::consistency::TOKEN_WRITES.contains(&id.as_str()) {
            let responses = operation
                .get_mut("responses")
                .and_then(Value::as_object_mut)
                .expect("responses are an object");
            for (status, response) in responses.iter_mut() {
                if status.starts_with('2') {
                    response["headers"]["Loupe-LSN"] = write_header.clone();
                }
            }
        }
    }
    // The lists name operations the code has: a renamed one is a bug, found here.
    for id in super::consistency::ROUTED_READS
        .iter()
        .chain(super::consistency::TOKEN_WRITES)
    {
        assert!(seen.iter().any(|s| s == id), "no operation {id}");
    }
}

/// Says `additionalProperties: true` on every object schema that names no member (metadata,
/// payloads, the members an entry keeps verbatim): generators otherwise read such an object as
/// one that must stay empty.
fn open_free_form_objects(value: &mut Value) {
    match value {
        Value::Object(node) => {
            let is_object = match node.get("type") {
                Some(Value::String(kind)) => kind == "object",
                Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
                _ => false,
            };
            if is_object
                && !node.contains_key("properties")
                && !node.contains_key("additionalProperties")
            {
                node.insert("additionalProperties".to_owned(), Value::Bool(true));
            }
            node.values_mut().for_each(open_free_form_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(open_free_form_objects),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    #[test]
    fn shared_answers_keep_an_operations_own_description() {
        let mut document = json!({"paths": {"/x": {"post": {
            "requestBody": {},
            "responses": {"200": {}, "422": {"description": "mine"}}
        }}}});
        add_shared_answers(&mut document);
        let responses: &Map<String, Value> = document["paths"]["/x"]["post"]["responses"]
            .as_object()
            .unwrap();
        let statuses: Vec<&str> = responses.keys().map(String::as_str).collect();
        assert_eq!(statuses, ["200", "400", "413", "415", "422", "503"]);
        assert_eq!(responses["422"]["description"], "mine");
    }
}
