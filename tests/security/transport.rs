//! Transport-level attacks: plaintext off loopback, an unsafe socket directory, silent and
//! oversized streams, stream floods and rapid resets on one connection, a revoked
//! certificate, and the dashboard without its token.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::harness::*;

/// Each service refuses plaintext on a non-loopback address without the flag, and says
/// what to do; with the flag it starts and logs the exposure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_off_loopback_needs_the_explicit_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sockets = |n: &str| format!("--socket-dir={}", d.join(n).display());
    let cases: Vec<(&str, &str, Vec<String>)> = vec![
        (
            "gateway",
            "session-gateway",
            vec![
                "--listen=0.0.0.0:0".into(),
                sockets("gw"),
                "--metrics-addr=0".into(),
            ],
        ),
        (
            "coordinator",
            "coordinator",
            vec![
                "--id=coord-0".into(),
                "--listen=0.0.0.0:0".into(),
                "--raft-bind=127.0.0.1:0".into(),
                format!("--data-dir={}", d.join("coord").display()),
                "--metrics-addr=0".into(),
            ],
        ),
        (
            "coordinator-raft",
            "coordinator",
            vec![
                "--id=coord-0".into(),
                "--listen=127.0.0.1:0".into(),
                "--raft-bind=0.0.0.0:0".into(),
                format!("--data-dir={}", d.join("coord2").display()),
                "--metrics-addr=0".into(),
            ],
        ),
        (
            "decide-work",
            "shard-decide",
            vec![
                sockets("dc"),
                "--provider-addr=unix:///nonexistent.sock".into(),
                format!("--data-dir={}", d.join("dc-data").display()),
                "--work-listen=0.0.0.0:0".into(),
                "--metrics-addr=0".into(),
            ],
        ),
        (
            "inspect-grpc",
            "inspect",
            vec![
                "--coordinator-addr=http://127.0.0.1:1".into(),
                "--listen=0.0.0.0:0".into(),
                "--http-listen=127.0.0.1:0".into(),
                "--metrics-addr=0".into(),
            ],
        ),
        (
            "inspect-http",
            "inspect",
            vec![
                "--coordinator-addr=http://127.0.0.1:1".into(),
                "--listen=127.0.0.1:0".into(),
                "--http-listen=0.0.0.0:0".into(),
                "--metrics-addr=0".into(),
            ],
        ),
    ];
    for (name, service, args) in &cases {
        let p = Proc::spawn(d, name, service, args);
        let (status, log) = p.exits().await;
        assert!(
            !status.success(),
            "{name} started in plaintext off loopback"
        );
        assert!(
            log.contains("--insecure-plaintext"),
            "{name}'s refusal says how to opt in:\n{log}"
        );
    }
    // With the flag: it serves, and says so once, loudly.
    let mut args = cases[0].2.clone();
    args[1] = sockets("gw2");
    args.push("--insecure-plaintext".into());
    let mut gw = Proc::spawn(d, "gateway-insecure", "session-gateway", &args);
    wait_until(WAIT, "the exposure warning", async || {
        gw.assert_running();
        let log = gw.log_text();
        if log.contains("WARN") && log.contains("insecure-plaintext") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_writable_socket_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = Proc::spawn(
        dir.path(),
        "gateway",
        "session-gateway",
        &[
            "--listen=127.0.0.1:0".into(),
            format!("--socket-dir={}", open.display()),
            "--metrics-addr=0".into(),
        ],
    );
    let (status, log) = p.exits().await;
    assert!(!status.success());
    assert!(log.contains("0777"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_is_closed_after_the_hello_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shard = Shard::start(dir.path(), &pki, &["--hello-timeout=1s"]).await;
    let ch = channel(shard.gateway_addr, Some(pki.client("cluster/c1")))
        .await
        .unwrap();
    let (_tx, rx) = tokio::sync::mpsc::channel::<bigfleet_proto::v1alpha1::OperatorMessage>(1);
    let opened = bigfleet_proto::v1alpha1::shard_client::ShardClient::new(ch)
        .session(ReceiverStream::new(rx))
        .await;
    let ended = match opened {
        Err(status) => status,
        Ok(resp) => {
            let mut inbound = resp.into_inner();
            match tokio::time::timeout(WAIT, inbound.message()).await {
                Ok(Err(status)) => status,
                other => panic!("a silent stream stayed open: {other:?}"),
            }
        }
    };
    assert_eq!(ended.code(), Code::InvalidArgument, "{ended:?}");
    assert!(
        ended.message().to_lowercase().contains("hello"),
        "{ended:?}"
    );
    assert_eq!(
        metric_sum(
            shard.gateway_metrics,
            "bigfleet_shard_sessions_refused_total",
            &["hello_timeout"]
        )
        .await,
        1.0
    );
}

/// A raw HTTP/2 connection over mTLS: what a hostile client that ignores gRPC's courtesies
/// can send.
async fn h2_client(
    addr: std::net::SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    let (client, conn) = h2::client::Builder::new()
        .max_concurrent_reset_streams(100_000)
        .handshake(stream)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

fn session_request() -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri("https://127.0.0.1/bigfleet.v1alpha1.Shard/Session")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// grpc-status of a response, from its headers (trailers-only) or its trailers.
async fn grpc_status(resp: h2::client::ResponseFuture) -> Option<String> {
    let resp = tokio::time::timeout(WAIT, resp).await.ok()?.ok()?;
    if let Some(s) = resp.headers().get("grpc-status") {
        return Some(s.to_str().unwrap().to_owned());
    }
    let mut body = resp.into_body();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data()).await.ok()? {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = tokio::time::timeout(WAIT, body.trailers())
        .await
        .ok()?
        .ok()??;
    trailers
        .get("grpc-status")
        .map(|s| s.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mib_first_frame_is_refused_without_growing_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut shard = Shard::start(dir.path(), &pki, &[]).await;
    let before = shard.gateway.rss_kib();
    let mut client = h2_client(shard.gateway_addr, pki.client("cluster/c1")).await;
    client = client.ready().await.unwrap();
    let (resp, mut body) = client.send_request(session_request(), false).unwrap();
    // A gRPC length prefix announcing 200 MiB, then as much of it as flow control lets
    // through within a few seconds.
    let mut first = vec![0u8];
    first.extend_from_slice(&(200u32 << 20).to_be_bytes());
    first.extend(std::iter::repeat_n(0u8, 1 << 20));
    let _ = body.send_data(Bytes::from(first), false);
    let sender = tokio::spawn(async move {
        for _ in 0..199 {
            body.reserve_capacity(1 << 20);
            match tokio::time::timeout(
                Duration::from_secs(2),
                std::future::poll_fn(|cx| body.poll_capacity(cx)),
            )
            .await
            {
                Ok(Some(Ok(_))) => {
                    if body
                        .send_data(Bytes::from(vec![0u8; 1 << 20]), false)
                        .is_err()
                    {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    let status = grpc_status(resp).await;
    assert_eq!(status.as_deref(), Some("8"), "RESOURCE_EXHAUSTED expected");
    let _ = sender.await;
    // A first frame under the roll-up bound but far over a Hello's is refused too: the
    // Hello is read before anything is known about the caller.
    let mut client = h2_client(shard.gateway_addr, pki.client("cluster/c2")).await;
    client = client.ready().await.unwrap();
    let (resp, mut body) = client.send_request(session_request(), false).unwrap();
    let mut mib = vec![0u8];
    mib.extend_from_slice(&(1u32 << 20).to_be_bytes());
    mib.extend(std::iter::repeat_n(0u8, 64 * 1024));
    let _ = body.send_data(Bytes::from(mib), false);
    assert_eq!(grpc_status(resp).await.as_deref(), Some("8"));
    shard.gateway.assert_running();
    let grown = shard.gateway.rss_kib().saturating_sub(before);
    assert!(grown < 8 * 1024, "gateway RSS grew by {grown} KiB");
    assert_eq!(
        metric_sum(
            shard.gateway_metrics,
            "bigfleet_shard_sessions_refused_total",
            &["hello_too_large"]
        )
        .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_floods_and_rapid_resets_leave_the_gateway_serving_others() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // No session-open budget here: the streams must stay open to test the per-connection cap.
    let mut shard = Shard::start(dir.path(), &pki, &["--session-open-rate=0"]).await;
    let before = shard.gateway.rss_kib();

    // 10,000 streams on one connection. The server advertises its cap in SETTINGS
    // (without it a client may open as many as it likes); a well-behaved client queues the
    // excess locally, a hostile one gets REFUSED_STREAM — either way the server holds at
    // most the cap.
    let mut client = h2_client(shard.gateway_addr, pki.client("cluster/flood")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let advertised = client.current_max_send_streams();
    assert!(
        advertised <= 512,
        "the gateway lets one connection open {advertised} streams"
    );
    let mut open = Vec::new();
    for _ in 0..10_000 {
        match tokio::time::timeout(Duration::from_millis(500), client.ready()).await {
            Ok(Ok(ready)) => {
                client = ready;
                match client.send_request(session_request(), false) {
                    Ok(pair) => open.push(pair),
                    Err(_) => break,
                }
            }
            _ => break,
        }
    }
    eprintln!("{} stream requests issued on one connection", open.len());

    // Rapid reset: open and cancel as fast as possible on a second connection.
    let mut rr = h2_client(shard.gateway_addr, pki.client("cluster/reset")).await;
    let mut sent = 0;
    for _ in 0..10_000 {
        match tokio::time::timeout(Duration::from_secs(2), rr.ready()).await {
            Ok(Ok(ready)) => rr = ready,
            _ => break,
        }
        match rr.send_request(session_request(), false) {
            Ok((_resp, mut s)) => {
                s.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(_) => break,
        }
    }
    assert!(sent > 0);

    // Everyone else is still served, and the gateway did not balloon.
    shard.gateway.assert_running();
    let ch = channel(shard.gateway_addr, Some(pki.client("cluster/c9")))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(bigfleet_proto::v1alpha1::OperatorMessage {
        payload: Some(bigfleet_proto::v1alpha1::operator_message::Payload::Hello(
            bigfleet_proto::v1alpha1::Hello {
                cluster_id: "c9".into(),
                protocol_version: "v1alpha1".into(),
            },
        )),
    })
    .await
    .unwrap();
    let mut inbound = bigfleet_proto::v1alpha1::shard_client::ShardClient::new(ch)
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let ack = tokio::time::timeout(WAIT, inbound.message())
        .await
        .unwrap()
        .unwrap();
    assert!(ack.is_some(), "a well-behaved operator is served");
    let grown = shard.gateway.rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "gateway RSS grew by {grown} KiB");
    drop(open);
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_after_the_crl_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let crl = dir.path().join("ca.crl");
    std::fs::write(
        &crl,
        pki.ca
            .revocation_list(&[], 1, Duration::from_secs(3600))
            .unwrap(),
    )
    .unwrap();
    let crl_flag = format!("--tls-crl={}", crl.display());
    let shard = Shard::start(dir.path(), &pki, &[crl_flag.as_str()]).await;
    let (files, leaf) = pki.leaf("readonly");
    let ctx = bigfleet_identity::TlsContext::load(&files).unwrap();
    let describe = |tls: Arc<rustls::ClientConfig>| {
        let addr = shard.gateway_addr;
        async move {
            match channel(addr, Some(tls)).await {
                Err(e) => Err(tonic::Status::unavailable(e)),
                Ok(ch) => bigfleet_proto::mesh::v1::shard_info_client::ShardInfoClient::new(ch)
                    .describe(bigfleet_proto::mesh::v1::DescribeShardRequest {})
                    .await
                    .map(|_| ()),
            }
        }
    };
    let r = describe(ctx.client_config().unwrap()).await;
    assert_eq!(code(&r), Code::Ok, "{r:?}");

    // Revoke it; the gateway re-reads the list on a later handshake (at most once a second).
    std::fs::write(
        &crl,
        pki.ca
            .revocation_list(&[&leaf.cert_der], 2, Duration::from_secs(3600))
            .unwrap(),
    )
    .unwrap();
    wait_until(WAIT, "the revoked certificate to be refused", async || {
        let r = describe(ctx.client_config().unwrap()).await;
        code(&r) != Code::Ok
    })
    .await;
    // Another reader's certificate still works.
    let r = describe(pki.client("readonly")).await;
    assert_eq!(code(&r), Code::Ok, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_needs_its_token_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "correct-horse-battery-staple\n").unwrap();
    let http = port();
    let mut inspect = Proc::spawn(
        dir.path(),
        "inspect",
        "inspect",
        &[
            "--coordinator-addr=http://127.0.0.1:1".into(),
            "--listen=127.0.0.1:0".into(),
            format!("--http-listen={http}"),
            format!("--http-token-file={}", token.display()),
            "--metrics-addr=0".into(),
        ],
    );
    wait_listening(&mut inspect, http).await;
    // Every page, asset and API path sits behind the gate, the history and per-shard
    // pages of ADR-0136 included.
    for path in [
        "/api/v1/summary",
        "/api/v1/history",
        "/api/v1/shards/shard-0/history",
        "/api/v1/clusters/c1/history",
        "/shards/shard-0",
        "/static/live.js",
        "/actions",
    ] {
        let (status, _) = http_request(http, path, &[]).await.unwrap();
        assert_eq!(status, 401, "{path} without a token");
    }
    // A wrong token is refused; the right one passes the gate as a bearer token or a cookie.
    for (path, header, passes) in [
        (
            "/api/v1/summary",
            ("Authorization", "Bearer wrong-horse-battery-staple"),
            false,
        ),
        (
            "/api/v1/summary",
            ("Authorization", "Bearer correct-horse-battery-staple"),
            true,
        ),
        (
            "/",
            ("Cookie", "bigfleet_token=correct-horse-battery-staple"),
            true,
        ),
    ] {
        let (status, _) = http_request(http, path, &[header]).await.unwrap();
        assert_eq!(status != 401, passes, "{path} with {header:?}: {status}");
    }
}
