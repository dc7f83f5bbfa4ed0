//! Clients that hold the server's resources without finishing their requests, over raw
//! TCP: headers sent a byte at a time (slowloris), a body that stalls, more connections
//! than the cap. Every timing here is a bound the gateway must enforce, asserted with wide
//! margins; none measures speed.

use std::time::{Duration, Instant};

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{upstream_config, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ENV: &[(&str, &str)] = &[("UPSTREAM_KEY", "upstream-secret")];

async fn setup(server: &str) -> (MockUpstream, TestGateway) {
    let mock = MockUpstream::start().await;
    let config = format!("{}\n[server]\n{server}", upstream_config(&mock.base_url(), ""));
    let gw = TestGateway::start(&config, ENV).await;
    (mock, gw)
}

/// Reads one HTTP response (head and `Content-Length` body), or what came before the
/// server closed the connection, for at most `limit`.
async fn read_response(tcp: &mut TcpStream, limit: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Err(_) | Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
            });
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn headers_sent_a_byte_at_a_time_are_cut_off() {
    let (_mock, gw) = setup("header_read_timeout_ms = 500").await;
    let head = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\nUser-Agent: slowloris\r\nAccept: */*\r\n\r\n", gw.addr);
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    // 50 ms a byte: the whole head would take several seconds, ten times the timeout.
    let mut sent = 0;
    let mut closed_early = false;
    for byte in head.as_bytes() {
        if tcp.write_all(&[*byte]).await.is_err() {
            closed_early = true;
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut probe = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(1), tcp.read(&mut probe)).await {
            closed_early = true;
            break;
        }
    }
    assert!(closed_early, "the server waited for the whole slow head ({sent} bytes)");
    assert!(sent < head.len(), "cut off after {sent} of {} bytes", head.len());
}

#[tokio::test]
async fn a_stalled_body_gets_408() {
    let (mock, gw) = setup("body_read_timeout_ms = 500").await;
    let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-acme-1\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\": \"mock\"";
    tcp.write_all(head.as_bytes()).await.expect("send head");
    // The rest of the body never comes.
    let answer = read_response(&mut tcp, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(answer.contains("\"type\":\"invalid_request_error\""), "{answer}");
    assert!(mock.received().is_empty());
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    let (_mock, gw) = setup("max_connections = 2").await;
    let request = "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut tcp = TcpStream::connect(gw.addr).await.expect("connect");
        tcp.write_all(request.as_bytes()).await.expect("send");
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await.expect("answer");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        held.push(tcp); // kept alive, idle
    }
    // The third connection is not served while two are open.
    let mut third = TcpStream::connect(gw.addr).await.expect("the kernel still accepts into the backlog");
    third.write_all(request.as_bytes()).await.expect("send");
    let mut buf = [0u8; 1024];
    let early = tokio::time::timeout(Duration::from_millis(1000), third.read(&mut buf)).await;
    assert!(early.is_err(), "a connection past the cap was served: {early:?}");
    // Closing one lets it in.
    drop(held.remove(0));
    let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
        .await
        .expect("served once a connection closed")
        .expect("readable");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
}

#[tokio::test]
async fn ordinary_clients_are_unaffected_by_the_timeouts() {
    let (_mock, gw) = setup("header_read_timeout_ms = 2000\nbody_read_timeout_ms = 2000\nmax_connections = 8").await;
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let resp = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth("sk-acme-1")
            .json(&serde_json::json!({"model": "mock", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("answer");
        assert_eq!(resp.status(), 200);
    }
    // A body over max_body_bytes is still refused by size.
    let resp = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .header("content-type", "application/json")
        .body(vec![b' '; 5 * 1024 * 1024])
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 413);
}
