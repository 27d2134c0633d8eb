//! Tenants and API keys: no caller reads another tenant's threads; credentials are checked.

use crate::common::{assistant, user, TestApp, ADMIN_KEY};
use axum::http::{header, Method, StatusCode};
use serde_json::{json, Value};

on_both_backends!(
    another_tenants_thread_is_not_found_on_every_endpoint,
    missing_malformed_unknown_and_revoked_keys_get_401,
    keys_are_for_tenants_and_the_admin_key_for_the_admin_api,
    admin_api_creates_lists_and_revokes_keys,
    open_mode_serves_the_default_tenant_without_keys,
    keys_are_stored_hashed,
);

/// Every request on tenant B's thread made with tenant A's key, and the same requests on a thread
/// that does not exist.
fn probes(thread: &str) -> Vec<(Method, String, Option<Value>)> {
    let base = format!("/v1/threads/{thread}");
    vec![
        (Method::GET, base.clone(), None),
        (
            Method::POST,
            format!("{base}/messages"),
            Some(json!({"messages": [user("a-intruder-1", "let me in")]})),
        ),
        (Method::GET, format!("{base}/messages"), None),
        (
            Method::GET,
            format!("{base}/messages?after_seq=0&limit=10"),
            None,
        ),
        (Method::GET, format!("{base}/context"), None),
        (Method::GET, format!("{base}/context?provider=openai"), None),
        (Method::GET, format!("{base}/rounds"), None),
        (
            Method::POST,
            format!("{base}/snip"),
            Some(json!({"seqs": [0]})),
        ),
        (
            Method::POST,
            format!("{base}/compact"),
            Some(json!({"keep_recent_rounds": 0})),
        ),
        (Method::GET, format!("{base}/settings"), None),
        (
            Method::PUT,
            format!("{base}/settings"),
            Some(json!({"auto_compact_tokens": 1000})),
        ),
        (
            Method::POST,
            format!("{base}/zoom"),
            Some(json!({"id": 0, "n": 1})),
        ),
        (Method::GET, format!("{base}/outline"), None),
        (Method::GET, format!("{base}/context?view=outline"), None),
        (Method::GET, format!("{base}/cursors"), None),
        (Method::GET, format!("{base}/cursors/reader"), None),
        (Method::GET, format!("{base}/cursors/reader/pending"), None),
        (
            Method::POST,
            format!("{base}/cursors/reader/claim"),
            Some(json!({"limit": 5})),
        ),
        (
            Method::POST,
            format!("{base}/cursors/reader/advance"),
            Some(json!({"to": "b-1"})),
        ),
        (Method::DELETE, base, None),
    ]
}

async fn another_tenants_thread_is_not_found_on_every_endpoint(app: TestApp) {
    let app = app.keyed();
    let key_a = app.create_key("tenant-a").await;
    let key_b = app.create_key("tenant-b").await;

    let created = app
        .post_as(
            &key_b,
            "/v1/threads",
            json!({"id": "b-secret", "metadata": {"owner": "b"}}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let appended = app
        .post_as(
            &key_b,
            "/v1/threads/b-secret/messages",
            json!({"messages": [user("b-1", "hello"), assistant("b-2", "msg_b", "hi")]}),
        )
        .await;
    assert_eq!(appended.status, StatusCode::CREATED, "{}", appended.body);
    // B has a cursor and settings of its own, so those probes aim at data that exists.
    let advanced = app
        .post_as(
            &key_b,
            "/v1/threads/b-secret/cursors/reader/advance",
            json!({"to": "b-1"}),
        )
        .await;
    assert_eq!(advanced.status, StatusCode::OK, "{}", advanced.body);
    let settings = app
        .request_as(
            Some(&key_b),
            Method::PUT,
            "/v1/threads/b-secret/settings",
            Some(json!({"auto_compact_tokens": 5000})),
        )
        .await;
    assert_eq!(settings.status, StatusCode::OK, "{}", settings.body);
    let before_thread = app.get_as(&key_b, "/v1/threads/b-secret").await.body;
    let before_messages = app
        .get_as(&key_b, "/v1/threads/b-secret/messages")
        .await
        .body;

    // The list of A does not show B's thread.
    let list = app.get_as(&key_a, "/v1/threads").await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.body["threads"], json!([]), "{}", list.body);

    for ((method, uri, body), (_, missing_uri, missing_body)) in
        probes("b-secret").into_iter().zip(probes("no-such-thread"))
    {
        let foreign = app
            .request_as(Some(&key_a), method.clone(), &uri, body)
            .await;
        foreign.assert_problem(StatusCode::NOT_FOUND, "not-found");
        // Exactly what a thread that does not exist gets: nothing tells them apart.
        let missing = app
            .request_as(Some(&key_a), method.clone(), &missing_uri, missing_body)
            .await;
        missing.assert_problem(StatusCode::NOT_FOUND, "not-found");
        assert_eq!(
            foreign.body["detail"], missing.body["detail"],
            "{method} {uri}"
        );
        assert_eq!(foreign.body["title"], missing.body["title"]);
    }

    // B's data is unchanged.
    assert_eq!(
        app.get_as(&key_b, "/v1/threads/b-secret").await.body,
        before_thread
    );
    assert_eq!(
        app.get_as(&key_b, "/v1/threads/b-secret/messages")
            .await
            .body,
        before_messages
    );
    let list_b = app.get_as(&key_b, "/v1/threads").await;
    assert_eq!(list_b.body["threads"].as_array().unwrap().len(), 1);

    // Thread ids are per tenant: A may use the same id, and gets its own thread.
    let own = app
        .post_as(&key_a, "/v1/threads", json!({"id": "b-secret"}))
        .await;
    assert_eq!(own.status, StatusCode::CREATED, "{}", own.body);
    assert_eq!(
        app.get_as(&key_a, "/v1/threads/b-secret").await.body["message_count"],
        0
    );
    assert_eq!(
        app.get_as(&key_b, "/v1/threads/b-secret").await.body["message_count"],
        2
    );
    app.finish().await;
}

fn assert_unauthorized(response: &crate::common::TestResponse) {
    response.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    let challenge = response
        .headers
        .get(header::WWW_AUTHENTICATE)
        .expect("a WWW-Authenticate header")
        .to_str()
        .unwrap();
    assert!(challenge.starts_with("Bearer"), "{challenge}");
}

async fn missing_malformed_unknown_and_revoked_keys_get_401(app: TestApp) {
    let app = app.keyed();
    let key = app.create_key("tenant-a").await;
    assert_eq!(app.get_as(&key, "/v1/threads").await.status, StatusCode::OK);

    // No header at all.
    assert_unauthorized(&app.request_as(None, Method::GET, "/v1/threads", None).await);
    // Malformed headers.
    for value in [
        "Basic dXNlcjpwYXNz".to_owned(),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        key.clone(),
        format!("Bearer {key} extra"),
        "Bearer not-a-key".to_owned(),
    ] {
        let request = axum::http::Request::builder()
            .uri("/v1/threads")
            .header(header::AUTHORIZATION, value.clone())
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.send(request).await;
        assert_unauthorized(&response);
    }
    // A well-formed key that was never issued, and a real key with a wrong secret.
    let forged = format!("lp_abcd1234_{}", "A".repeat(32));
    assert_unauthorized(&app.get_as(&forged, "/v1/threads").await);
    // Its last character changed (to one it is not: a secret ending in `X` made this the key).
    let other = if key.ends_with('X') { 'Y' } else { 'X' };
    let wrong_secret = format!("{}{other}", &key[..key.len() - 1]);
    assert_unauthorized(&app.get_as(&wrong_secret, "/v1/threads").await);

    // A revoked key.
    let record = app.create_key_record("tenant-a").await;
    let revoked = record["key"].as_str().unwrap();
    assert_eq!(
        app.get_as(revoked, "/v1/threads").await.status,
        StatusCode::OK
    );
    let id = record["id"].as_str().unwrap();
    let revoke = app
        .delete_as(ADMIN_KEY, &format!("/v1/admin/keys/{id}"))
        .await;
    assert_eq!(revoke.status, StatusCode::NO_CONTENT, "{}", revoke.body);
    assert_unauthorized(&app.get_as(revoked, "/v1/threads").await);
    // The tenant's other key still works.
    assert_eq!(app.get_as(&key, "/v1/threads").await.status, StatusCode::OK);

    // Problems carry the request id of the response.
    let response = app.request_as(None, Method::GET, "/v1/threads", None).await;
    let request_id = response
        .headers
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(response.body["request_id"], request_id);

    // Public endpoints need no key.
    assert_eq!(app.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(app.get("/openapi.json").await.status, StatusCode::OK);
    app.finish().await;
}

async fn keys_are_for_tenants_and_the_admin_key_for_the_admin_api(app: TestApp) {
    let app = app.keyed();
    let key = app.create_key("tenant-a").await;
    for (method, uri) in [
        (Method::GET, "/v1/admin/keys"),
        (Method::GET, "/v1/admin/tenants"),
        (Method::DELETE, "/v1/admin/keys/key_x"),
    ] {
        app.request_as(Some(&key), method, uri, None)
            .await
            .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    }
    app.post_as(&key, "/v1/admin/keys", json!({"tenant": "tenant-a"}))
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    app.post_as(&key, "/v1/admin/tenants", json!({"id": "evil"}))
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    // Without any key: 401.
    assert_unauthorized(
        &app.request_as(None, Method::GET, "/v1/admin/keys", None)
            .await,
    );
    // The admin key acts for no tenant.
    app.get_as(ADMIN_KEY, "/v1/threads")
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    // Nothing was created by the refused requests.
    let tenants = app.get_as(ADMIN_KEY, "/v1/admin/tenants").await;
    let ids: Vec<&str> = tenants.body["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["tenant-a"]);
    app.finish().await;
}

async fn admin_api_creates_lists_and_revokes_keys(app: TestApp) {
    let app = app.keyed();
    let created = app
        .post_as(
            ADMIN_KEY,
            "/v1/admin/tenants",
            json!({"id": "acme", "name": "ACME"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["name"], "ACME");
    app.post_as(ADMIN_KEY, "/v1/admin/tenants", json!({"id": "acme"}))
        .await
        .assert_problem(StatusCode::CONFLICT, "tenant-exists");
    app.post_as(ADMIN_KEY, "/v1/admin/tenants", json!({"id": "no spaces"}))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "validation");

    let first = app.create_key_record("acme").await;
    let key = first["key"].as_str().unwrap();
    let prefix = first["prefix"].as_str().unwrap();
    assert!(key.starts_with(&format!("lp_{prefix}_")), "{key}");
    assert!(key.len() >= 3 + 8 + 1 + 32);
    app.create_key_record("other").await;

    let all = app.get_as(ADMIN_KEY, "/v1/admin/keys").await;
    assert_eq!(all.status, StatusCode::OK);
    assert_eq!(all.body["keys"].as_array().unwrap().len(), 2);
    let acme = app.get_as(ADMIN_KEY, "/v1/admin/keys?tenant=acme").await;
    let keys = acme.body["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["prefix"], prefix);
    assert!(keys[0].get("key").is_none());
    // The listing never holds the secret.
    let secret = &key[key.len() - 32..];
    assert!(!all.body.to_string().contains(secret));

    let id = first["id"].as_str().unwrap();
    let uri = format!("/v1/admin/keys/{id}");
    assert_eq!(
        app.delete_as(ADMIN_KEY, &uri).await.status,
        StatusCode::NO_CONTENT
    );
    // Revoking twice changes nothing.
    assert_eq!(
        app.delete_as(ADMIN_KEY, &uri).await.status,
        StatusCode::NO_CONTENT
    );
    let listed = app.get_as(ADMIN_KEY, "/v1/admin/keys?tenant=acme").await;
    assert!(listed.body["keys"][0]["revoked_at"].is_string());
    app.delete_as(ADMIN_KEY, "/v1/admin/keys/key_nope")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

async fn open_mode_serves_the_default_tenant_without_keys(app: TestApp) {
    let thread = app.thread("local").await;
    let response = app.get(&format!("/v1/threads/{thread}")).await;
    assert_eq!(response.status, StatusCode::OK);
    // A header is ignored in open mode, and the admin API is off.
    assert_eq!(
        app.get_as("whatever", "/v1/threads").await.body["threads"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    app.get("/v1/admin/keys")
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    // The threads are the default tenant's: a keyed service shows them to no other tenant.
    let app = app.keyed();
    let key = app.create_key("someone").await;
    app.get_as(&key, "/v1/threads/local")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    app.finish().await;
}

async fn keys_are_stored_hashed(app: TestApp) {
    assert!(!app.store.has_active_api_keys().await.unwrap());
    let tenant = loupe::store::TenantId("acme".to_owned());
    let created = app.store.create_api_key(&tenant, Some("ci")).await.unwrap();
    assert!(app.store.has_active_api_keys().await.unwrap());
    let identity = app
        .store
        .authenticate_api_key(&created.plaintext)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(identity.tenant, tenant);
    // Listings never hold the secret part of the key.
    let listed = format!("{:?}", app.store.list_api_keys(None).await.unwrap());
    assert!(!listed.contains(&created.plaintext[12..]));
    app.store.revoke_api_key(&created.record.id).await.unwrap();
    assert!(app
        .store
        .authenticate_api_key(&created.plaintext)
        .await
        .unwrap()
        .is_none());
    assert!(!app.store.has_active_api_keys().await.unwrap());
    app.finish().await;
}
