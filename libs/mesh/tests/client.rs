//! The client stack against a real server: what is retried, how often, per-attempt timeouts,
//! attempt hooks and client metrics.

use crate::common;

use std::time::Duration;

use bigfleet_mesh::{
    ChannelConfig, ClientStackConfig, GrpcMetrics, RetryPolicy, ServerStackConfig, dial, dial_lazy,
};
use bigfleet_telemetry::MetricsRegistry;
use common::{
    Echo, code, dial_once, dial_with, no_retry, rate_limited, retrying, say, serve_echo, tcp_target,
};
use tonic::Code;

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

#[tokio::test]
async fn unavailable_is_retried_until_success_and_counted() {
    let echo = Echo::failing_first(2);
    let server = serve_echo(ServerStackConfig::default(), echo.clone()).await;
    let registry = MetricsRegistry::new();
    let stack = ClientStackConfig {
        metrics: Some(GrpcMetrics::client(&registry).unwrap()),
        retry: fast_retry(4),
        attempt_timeout: None,
    };
    let ch = dial_with(&server, &stack).await;
    assert_eq!(say(&ch, "flaky").await.unwrap().text, "flaky");
    assert_eq!(echo.calls(), 3);
    let text = registry.encode_text().unwrap();
    assert!(
        text.contains("grpc_client_retries_total{grpc_code=\"Unavailable\",grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"} 2"),
        "{text}"
    );
    // One logical call, observed once with its final code.
    assert!(
        text.contains("grpc_client_handled_total{grpc_code=\"OK\",grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"} 1"),
        "{text}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn failed_precondition_is_never_retried() {
    let echo = Echo::default();
    let server = serve_echo(ServerStackConfig::default(), echo.clone()).await;
    let stack = retrying(fast_retry(5));
    let ch = dial_with(&server, &stack).await;
    assert_eq!(code(&say(&ch, "fenced").await), Code::FailedPrecondition);
    assert_eq!(echo.calls(), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn attempts_are_bounded() {
    let echo = Echo::failing_first(100);
    let server = serve_echo(ServerStackConfig::default(), echo.clone()).await;
    let stack = retrying(fast_retry(3));
    let ch = dial_with(&server, &stack).await;
    assert_eq!(code(&say(&ch, "flaky").await), Code::Unavailable);
    assert_eq!(echo.calls(), 3);
    let none = no_retry();
    let ch = dial_with(&server, &none).await;
    assert_eq!(code(&say(&ch, "flaky").await), Code::Unavailable);
    assert_eq!(echo.calls(), 4);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hung_attempt_times_out_and_the_retry_is_stamped() {
    let echo = Echo {
        sleep_once: true,
        ..Echo::default()
    };
    let server = serve_echo(ServerStackConfig::default(), echo.clone()).await;
    let stack = ClientStackConfig {
        retry: fast_retry(3).with_attempt_hook(|attempt, parts| {
            parts
                .headers
                .insert("x-attempt", attempt.to_string().parse().unwrap());
        }),
        attempt_timeout: Some(Duration::from_millis(150)),
        ..ClientStackConfig::default()
    };
    let ch = dial_with(&server, &stack).await;
    let started = std::time::Instant::now();
    let reply = say(&ch, "sleep:5000").await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(echo.calls(), 2);
    assert_eq!(
        reply.attempt, "1",
        "the second attempt carries its own stamp"
    );

    server.shutdown().await.unwrap();

    // Without retries the attempt timeout surfaces as DEADLINE_EXCEEDED.
    let always_slow = serve_echo(ServerStackConfig::default(), Echo::default()).await;
    let once = ClientStackConfig {
        retry: RetryPolicy::none(),
        attempt_timeout: Some(Duration::from_millis(100)),
        ..ClientStackConfig::default()
    };
    let ch = dial_with(&always_slow, &once).await;
    assert_eq!(code(&say(&ch, "sleep:1000").await), Code::DeadlineExceeded);
    always_slow.shutdown().await.unwrap();
}

#[tokio::test]
async fn resource_exhausted_is_retried_only_when_asked() {
    let echo = Echo::default();
    let server = serve_echo(rate_limited(10.0, 1), echo.clone()).await;
    let plain = dial_with(&server, &retrying(fast_retry(4))).await;
    assert_eq!(code(&say(&plain, "ok").await), Code::Ok);
    assert_eq!(code(&say(&plain, "ok").await), Code::ResourceExhausted);

    let patient = retrying(
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(200),
            ..RetryPolicy::default()
        }
        .retry_resource_exhausted(),
    );
    let patient = dial_with(&server, &patient).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(code(&say(&patient, "ok").await), Code::Ok);
    assert_eq!(
        code(&say(&patient, "ok").await),
        Code::Ok,
        "waited for a token"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_after_bounded_retries() {
    let port = bigfleet_testkit::free_tcp_port().unwrap();
    let registry = MetricsRegistry::new();
    let ch = dial_lazy(
        &format!("http://127.0.0.1:{port}"),
        &ChannelConfig::default(),
        &ClientStackConfig {
            metrics: Some(GrpcMetrics::client(&registry).unwrap()),
            retry: fast_retry(3),
            ..ClientStackConfig::default()
        },
    )
    .unwrap();
    assert_eq!(code(&say(&ch, "ok").await), Code::Unavailable);
    let text = registry.encode_text().unwrap();
    assert!(text.contains("grpc_client_retries_total{grpc_code=\"Unavailable\",grpc_method=\"Say\",grpc_service=\"test.v1.Echo\"} 2"), "{text}");
    // Eager dialing reports the failure up front.
    assert!(
        dial(
            &format!("http://127.0.0.1:{port}"),
            &ChannelConfig::default(),
            &ClientStackConfig::default()
        )
        .await
        .is_err()
    );
}

#[tokio::test]
async fn the_typed_retry_helper_restamps_each_attempt() {
    let echo = Echo::failing_first(2);
    let server = serve_echo(ServerStackConfig::default(), echo.clone()).await;
    let ch = dial_once(&tcp_target(&server)).await;
    // What a provider call does: the request body differs per attempt (base + attempt).
    let base = 65_536u64;
    let mut sent = Vec::new();
    let reply = fast_retry(4)
        .run(|attempt| {
            let seq = base + u64::from(attempt);
            sent.push(seq);
            let ch = ch.clone();
            async move {
                let r = say(&ch, "flaky").await?;
                Ok((seq, r))
            }
        })
        .await
        .unwrap();
    assert_eq!(sent, vec![65_536, 65_537, 65_538]);
    assert_eq!(reply.0, 65_538);
    assert_eq!(echo.calls(), 3);
    server.shutdown().await.unwrap();
}
