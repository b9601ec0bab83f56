//! The server builder over TCP and a Unix socket: health, reflection (v1 and v1alpha),
//! health flips, graceful shutdown and the drain deadline.

use crate::common;

use std::time::{Duration, Instant};

use bigfleet_mesh::{MeshChannel, MeshServer, ServerStackConfig, ServingStatus};
use common::{Echo, dial_once, echo_descriptor_set, say, serve_echo_unix};
use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus as Wire;
use tonic_health::pb::health_client::HealthClient;

async fn health(channel: &MeshChannel, service: &str) -> Result<i32, tonic::Status> {
    HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map(|r| r.into_inner().status)
}

/// Reflection's ListServices, sorted. tonic generates the same client twice, for the
/// `v1` and the `v1alpha` protocol; a server must answer both.
macro_rules! list_services {
    ($name:ident, $version:ident) => {
        async fn $name(channel: &MeshChannel) -> Vec<String> {
            use tonic_reflection::pb::$version::ServerReflectionRequest;
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            let req = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut stream = ServerReflectionClient::new(channel.clone())
                .server_reflection_info(tokio_stream::iter(vec![req]))
                .await
                .unwrap()
                .into_inner();
            let resp = stream.next().await.unwrap().unwrap();
            match resp.message_response.unwrap() {
                MessageResponse::ListServicesResponse(l) => {
                    let mut names: Vec<_> = l.service.into_iter().map(|s| s.name).collect();
                    names.sort();
                    names
                }
                other => panic!("unexpected reflection response {other:?}"),
            }
        }
    };
}

list_services!(list_v1, v1);
list_services!(list_v1alpha, v1alpha);

#[tokio::test]
async fn health_and_reflection_over_tcp_and_uds() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run").join("echo.sock");
    let running = MeshServer::new("echo", ServerStackConfig::default())
        .tcp("127.0.0.1:0".parse().unwrap())
        .unix(&sock)
        .descriptor_set(echo_descriptor_set())
        .add_service(Echo::default())
        .start()
        .await
        .unwrap();
    let tcp = running.tcp_addr().unwrap();
    assert_ne!(tcp.port(), 0);
    assert_eq!(running.unix_path(), Some(sock.as_path()));

    let expected = vec![
        "grpc.health.v1.Health".to_owned(),
        "grpc.reflection.v1.ServerReflection".to_owned(),
        "grpc.reflection.v1alpha.ServerReflection".to_owned(),
        "test.v1.Echo".to_owned(),
    ];
    for target in [
        format!("http://{tcp}"),
        format!("unix://{}", sock.display()),
    ] {
        let ch = dial_once(&target).await;
        assert_eq!(
            health(&ch, "").await.unwrap(),
            Wire::Serving as i32,
            "{target}"
        );
        assert_eq!(
            health(&ch, "test.v1.Echo").await.unwrap(),
            Wire::Serving as i32
        );
        assert_eq!(list_v1(&ch).await, expected, "{target}");
        assert_eq!(list_v1alpha(&ch).await, expected, "{target}");
        let reply = say(&ch, "ok").await.unwrap();
        let want_peer = if target.starts_with("unix") {
            "local"
        } else {
            "plaintext"
        };
        assert_eq!(reply.peer, want_peer);
    }
    running.shutdown().await.unwrap();
    assert!(!sock.exists(), "socket file removed on shutdown");
}

#[tokio::test]
async fn health_status_can_be_flipped_per_service() {
    let running = MeshServer::new("echo", ServerStackConfig::default())
        .tcp("127.0.0.1:0".parse().unwrap())
        .add_service_with_status(Echo::default(), ServingStatus::NotServing)
        .start()
        .await
        .unwrap();
    let ch = dial_once(&format!("http://{}", running.tcp_addr().unwrap())).await;
    assert_eq!(
        health(&ch, "test.v1.Echo").await.unwrap(),
        Wire::NotServing as i32
    );
    running
        .health()
        .set_service_status("test.v1.Echo", ServingStatus::Serving)
        .await;
    assert_eq!(
        health(&ch, "test.v1.Echo").await.unwrap(),
        Wire::Serving as i32
    );
    assert_eq!(
        health(&ch, "no.such.Service").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("decide.sock");
    std::fs::write(&sock, b"stale").unwrap();
    let running = serve_echo_unix(&sock, Echo::default()).await;
    let ch = dial_once(&format!("unix://{}", sock.display())).await;
    assert!(say(&ch, "ok").await.is_ok());
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_needs_a_listener() {
    let err = MeshServer::new("nothing", ServerStackConfig::default())
        .start()
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("no listener"), "{err}");
}

#[tokio::test]
async fn shutdown_drains_in_flight_calls_then_refuses_new_ones() {
    let running = MeshServer::new("echo", ServerStackConfig::default())
        .tcp("127.0.0.1:0".parse().unwrap())
        .add_service(Echo::default())
        .start()
        .await
        .unwrap();
    let addr = running.tcp_addr().unwrap();
    let ch = dial_once(&format!("http://{addr}")).await;
    let token = running.shutdown_token();
    let in_flight = tokio::spawn({
        let ch = ch.clone();
        async move { say(&ch, "sleep:300").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    running.shutdown().await.unwrap();
    assert!(token.is_cancelled());
    // The call that was running when shutdown began completed normally.
    assert_eq!(in_flight.await.unwrap().unwrap().text, "sleep:300");
    // The listener is closed.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn the_drain_deadline_closes_calls_that_do_not_finish() {
    let running = MeshServer::new("echo", ServerStackConfig::default())
        .tcp("127.0.0.1:0".parse().unwrap())
        .add_service(Echo::default())
        .drain_deadline(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let ch = dial_once(&format!("http://{}", running.tcp_addr().unwrap())).await;
    let stuck = tokio::spawn({
        let ch = ch.clone();
        async move { say(&ch, "sleep:60000").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    running.shutdown().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let result = tokio::time::timeout(Duration::from_secs(3), stuck)
        .await
        .expect("the stuck call must be cut off")
        .unwrap();
    assert!(result.is_err(), "{result:?}");
}
