//! `bigfleet svc <name> [service flags]`: runs one service in this process (ADR-0005).
//!
//! The hidden multi-call subcommand `bigfleet up` starts its children with. Each service
//! parses its own `Args` (the same struct its standalone binary parses, under the same
//! program name, so `--help` and errors read the same) and runs the same `run`. The
//! telemetry a service installs is its own (`service.name` = its binary's name), which is
//! why `main` hands `svc` over before installing the CLI's quiet subscriber.
//!
//! When started by `bigfleet up` (environment [`PARENT_PID_ENV`]), the child also asks the
//! kernel to SIGTERM it if `up` dies without stopping it, so even a SIGKILLed `up` leaves
//! nothing running.

use std::ffi::OsString;
use std::process::ExitCode;

use bigfleet_telemetry::{LogFormat, TelemetryConfig, TelemetryGuard};
use clap::Parser;

/// Set by `bigfleet up` on every child: the pid of the supervising `up` process.
pub const PARENT_PID_ENV: &str = "BIGFLEET_UP_PARENT_PID";

/// The services `bigfleet svc` can run, by subcommand name.
pub const SERVICES: [&str; 6] = [
    "coordinator",
    "shard-decide",
    "shard-execute",
    "session-gateway",
    "inspect",
    "fake-provider",
];

/// Whether the process was invoked as `bigfleet svc ...` (decided before clap parses the
/// CLI: service flags such as `--tls-cert` would collide with the CLI's global flags).
pub fn is_svc_invocation(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "svc")
}

/// The standalone binary name of a service (`shard-decide` ⇒ `bigfleet-shard-decide`).
pub fn binary_name(service: &str) -> String {
    format!("bigfleet-{service}")
}

fn usage() -> String {
    format!(
        "usage: bigfleet svc <service> [flags]\nservices: {}\n(each accepts exactly the flags of its own binary; see docs/flags.md)",
        SERVICES.join(", ")
    )
}

/// Entry point for `argv = [bigfleet, svc, <name>, flags...]`.
pub async fn main(argv: Vec<OsString>) -> ExitCode {
    let mut rest = argv.into_iter().skip(2);
    let Some(name) = rest.next().and_then(|n| n.into_string().ok()) else {
        eprintln!("{}", usage());
        return ExitCode::from(2);
    };
    if name == "--help" || name == "-h" || name == "help" {
        println!("{}", usage());
        return ExitCode::SUCCESS;
    }
    if !SERVICES.contains(&name.as_str()) {
        eprintln!("bigfleet svc: unknown service {name:?}\n{}", usage());
        return ExitCode::from(2);
    }
    watch_parent();
    let argv: Vec<OsString> = std::iter::once(OsString::from(binary_name(&name)))
        .chain(rest)
        .collect();
    match run(&name, argv).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e:#}", binary_name(&name));
            ExitCode::FAILURE
        }
    }
}

fn parse<A: Parser>(argv: Vec<OsString>) -> A {
    // Same behaviour as the standalone binary: --help prints and exits 0, bad flags exit 2.
    A::try_parse_from(argv).unwrap_or_else(|e| e.exit())
}

fn telemetry(service: &str, format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    Ok(bigfleet_telemetry::init(&TelemetryConfig::from_env(
        &binary_name(service),
        format,
    ))?)
}

/// Parses `argv` (program name first) as `service`'s flags and runs it to completion.
pub async fn run(service: &str, argv: Vec<OsString>) -> anyhow::Result<()> {
    // Every service crate exposes `Args` (its log format under `service.log`) and `run`;
    // only the crate differs between the arms.
    macro_rules! serve_crate {
        ($krate:ident) => {
            serve(
                service,
                argv,
                |a: &$krate::Args| a.service.log.log_format,
                $krate::run,
            )
            .await
        };
    }
    match service {
        "coordinator" => serve_crate!(svc_coordinator),
        "shard-decide" => serve_crate!(svc_shard_decide),
        "shard-execute" => serve_crate!(svc_shard_execute),
        "session-gateway" => serve_crate!(svc_session_gateway),
        "inspect" => serve_crate!(svc_inspect),
        // The fake provider's `run` installs its own telemetry.
        "fake-provider" => bigfleet_fake_provider::run(parse(argv)).await,
        other => anyhow::bail!("unknown service {other:?}"),
    }
}

/// Parses `argv` as `A`, installs the service's telemetry in the log format its flags
/// name, and runs it.
async fn serve<A: Parser, F: Future<Output = anyhow::Result<()>>>(
    service: &str,
    argv: Vec<OsString>,
    log_format: impl FnOnce(&A) -> LogFormat,
    run: impl FnOnce(A) -> F,
) -> anyhow::Result<()> {
    let args: A = parse(argv);
    let guard = telemetry(service, log_format(&args))?;
    let r = run(args).await;
    // Flush spans while the runtime is still alive.
    drop(guard);
    r
}

/// What `<service binary> --help` prints (flag-parity tests).
pub fn long_help(service: &str) -> Option<String> {
    use clap::CommandFactory;
    let cmd = match service {
        "coordinator" => svc_coordinator::Args::command(),
        "shard-decide" => svc_shard_decide::Args::command(),
        "shard-execute" => svc_shard_execute::Args::command(),
        "session-gateway" => svc_session_gateway::Args::command(),
        "inspect" => svc_inspect::Args::command(),
        "fake-provider" => bigfleet_fake_provider::cli::Args::command(),
        _ => return None,
    };
    let bin = binary_name(service);
    match cmd.try_get_matches_from([bin.as_str(), "--help"]) {
        Err(e) => Some(e.render().to_string()),
        Ok(_) => None,
    }
}

/// Under `bigfleet up`: die with the parent. PR_SET_PDEATHSIG covers a parent that is
/// killed outright (no chance to stop its children); the pid check covers a parent that
/// died before the request was made.
fn watch_parent() {
    let Some(expected) = std::env::var(PARENT_PID_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
    else {
        return;
    };
    if let Err(e) =
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
    {
        eprintln!("bigfleet svc: cannot request a parent-death signal: {e}");
    }
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
    if parent != expected {
        eprintln!("bigfleet svc: supervising process {expected} is gone; exiting");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_the_multi_call_form() {
        let v = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(is_svc_invocation(&v(&["bigfleet", "svc", "inspect"])));
        assert!(!is_svc_invocation(&v(&["bigfleet", "shards"])));
        assert!(!is_svc_invocation(&v(&["bigfleet"])));
    }

    #[test]
    fn every_service_has_help_under_its_binary_name() {
        for s in SERVICES {
            let help = long_help(s).unwrap();
            assert!(
                help.contains(&format!("Usage: {}", binary_name(s))),
                "{s}: {help}"
            );
        }
        assert!(long_help("nope").is_none());
    }
}
