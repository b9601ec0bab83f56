//! The ops server over a real socket, with graceful shutdown.

use std::net::SocketAddr;

use bigfleet_telemetry::{MetricsRegistry, OpsServer, Readiness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn serves_probes_and_metrics_then_shuts_down() {
    let registry = MetricsRegistry::new();
    registry.int_gauge("up_things", "things").unwrap().set(4);
    let readiness = Readiness::not_ready("warming up");
    let server = OpsServer::start(
        Some("127.0.0.1:0".parse().unwrap()),
        registry,
        readiness.clone(),
    )
    .await
    .unwrap();
    let addr = server.addr().unwrap();

    assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    let not_ready = http_get(addr, "/readyz").await;
    assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
    assert!(not_ready.ends_with("warming up\n"), "{not_ready}");
    readiness.set_ready();
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(addr, "/metrics").await.contains("up_things 4"));

    server.stop().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener must be closed"
    );
}
