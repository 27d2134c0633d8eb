//! Keep-alive after an answer sent before the request's body was read (issue 53, finding 5): a
//! 401, 403, 400 or 413 that leaves the body unread says `Connection: close`, and the server then
//! closes, so a client never sends its next pooled request on a connection about to close.

use std::sync::Arc;
use std::time::Duration;

use loupe::http::{AuthMode, Limits};
use loupe::jobs::JobsConfig;
use loupe::summarize::ExtractiveSummarizer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{TestApp, ADMIN_KEY};

on_both_backends!(an_answer_before_the_body_is_read_says_the_connection_closes);

/// The body limit of the listener under test: a larger announced body is refused unread.
const BODY_LIMIT: usize = 64 * 1024;

/// One answer read off a connection: its head (lower-cased names) and its body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }

    fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
    }
}

/// Reads one answer (its head, then `Content-Length` bytes of body); `None` when the connection
/// closed or failed first.
async fn read_answer(stream: &mut TcpStream) -> Option<Answer> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(Answer { status, headers })
}

/// Whether the server closes the connection (reads end) within a few seconds.
async fn closes(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

/// Sends a request's head announcing `length` bytes of body, and none of the body: the answer
/// comes before the server reads it. Then the answer must say the connection closes (and it
/// does), or the connection must still serve: the body sent late, a second request is answered.
async fn check_early_answer(addr: std::net::SocketAddr, what: &str, head: String, status: u16) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_answer(&mut stream)
        .await
        .unwrap_or_else(|| panic!("{what}: no answer"));
    assert_eq!(answer.status, status, "{what}");
    if answer.says_close() {
        assert!(closes(&mut stream).await, "{what}: said close, stayed open");
        return;
    }
    // Not said: the connection must still be usable for the client's next pooled request.
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut next = vec![b'{'; length.min(BODY_LIMIT)];
    next.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let sent = stream.write_all(&next).await;
    let second = match sent {
        Ok(()) => read_answer(&mut stream).await,
        Err(_) => None,
    };
    assert!(
        second.as_ref().is_some_and(|second| second.status == 200),
        "{what}: answered without `Connection: close`, and the next request on the connection \
         got {:?}",
        second.map(|second| second.status)
    );
}

/// 401 (a wrong key), 403 (the admin key on a tenant's route), 400 (a NUL in the path) and 413
/// (a body announced past the limit), each answered before the body is read.
async fn an_answer_before_the_body_is_read_says_the_connection_closes(test: TestApp) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = loupe::app::App {
        store: test.store.clone(),
        auth: AuthMode::Keyed {
            admin_key: Some(ADMIN_KEY.to_owned()),
        },
        limits: Limits {
            rate_limit_per_sec: 0.0,
            body_bytes: BODY_LIMIT,
            ..Limits::default()
        },
        listener: Some(listener),
        workers: 0,
        jobs: JobsConfig::default(),
        summarizer: Arc::new(ExtractiveSummarizer::new()),
        grace: Duration::from_secs(1),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(loupe::app::run(app, async move {
        let _ = stopped.await;
    }));
    let request = |path: &str, key: &str, length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
    };
    let cases = [
        (
            "401",
            request("/v1/threads", "not-a-key-of-anyone", 1_000),
            401,
        ),
        ("403", request("/v1/threads", ADMIN_KEY, 1_000), 403),
        (
            "400",
            request("/v1/admin/keys/a%00b", ADMIN_KEY, 1_000),
            400,
        ),
        (
            "413",
            request("/v1/admin/keys", ADMIN_KEY, BODY_LIMIT + 1),
            413,
        ),
    ];
    for (what, head, status) in cases {
        check_early_answer(addr, what, head, status).await;
    }
    // A request whose body was read whole keeps its connection, error or not.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body = "{\"tenant\": 5}";
    let mut both = request("/v1/admin/keys", ADMIN_KEY, body.len()) + body;
    both.push_str("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(both.as_bytes()).await.unwrap();
    let first = read_answer(&mut stream).await.expect("an answer");
    assert!((400..500).contains(&first.status), "{}", first.status);
    assert!(
        !first.says_close(),
        "a body read whole keeps the connection"
    );
    let second = read_answer(&mut stream).await.expect("a second answer");
    assert_eq!(second.status, 200);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    test.finish().await;
}
