use clap::Parser;

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
    let cli = bigfleet::cli::Cli::parse();
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
    match bigfleet::run(cli, &mut out, &mut err).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bigfleet: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
