//! The stop signal of processes that stop alike on SIGTERM and SIGINT.
//!
//! It sends SIGTERM to its own process, which only the handler under test keeps alive:
//! nextest gives every test a process of its own (docs/testing.md).

use std::process::Command;
use std::time::Duration;

#[tokio::test]
async fn stop_signal_resolves_on_sigterm() {
    let mut stop = Box::pin(bigfleet_mesh::stop_signal());
    // The first poll installs the handler; it must be in place before the
    // signal is sent, or SIGTERM's default action ends the test process.
    tokio::select! {
        biased;
        () = &mut stop => panic!("resolved before any signal"),
        () = std::future::ready(()) => {}
    }
    let sent = Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success());
    // A guard against hanging, not a measurement.
    tokio::time::timeout(Duration::from_secs(60), stop)
        .await
        .expect("stop_signal resolves on SIGTERM");
}
