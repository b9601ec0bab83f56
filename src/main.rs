// The same allocator as the per-service binaries (ADR-0031): `bigfleet svc decide`
// must behave like `bigfleet-shard-decide`.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // `bigfleet svc <service> ...` parses the service's own flags and installs the
    // service's own telemetry (ADR-0005), so it goes first.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if bigfleet::svc::is_svc_invocation(&argv) {
        return bigfleet::svc::main(argv).await;
    }
    let cli = bigfleet::cli::parse_from(argv);
    // Quiet by default: a CLI prints results, not service logs (RUST_LOG overrides).
    let telemetry =
        bigfleet_telemetry::TelemetryConfig::from_lookup("bigfleet", Default::default(), |k| {
            std::env::var(k)
                .ok()
                .or_else(|| (k == "RUST_LOG").then(|| "warn".to_owned()))
        });
    let _guard = bigfleet_telemetry::init(&telemetry).ok();
    if let bigfleet::cli::Command::Up(args) = cli.command {
        return bigfleet::up::main(args).await;
    }
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    // Ctrl-C ends a `--watch` cleanly; other commands never wait on it (the signal is
    // only hooked once a watch starts waiting).
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match bigfleet::run_until(cli, &mut out, &mut err, ctrl_c).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bigfleet: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
