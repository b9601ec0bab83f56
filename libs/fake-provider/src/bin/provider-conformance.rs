//! `provider-conformance --target ADDR`: runs the provider conformance suite against any
//! `bigfleet.v1alpha1.CapacityProvider` and prints one line per test and a summary.
//! Exits non-zero when a test fails.

use bigfleet_fake_provider::{conformance, connect};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "provider-conformance",
    about = "Provider conformance suite (docs/provider-guide.md, \"Running the conformance suite\")"
)]
struct Args {
    /// Provider address: `unix:///path.sock`, `http://host:port` or `host:port`.
    #[arg(long, env = "BIGFLEET_PROVIDER_TARGET")]
    target: String,
    /// Only run tests whose name contains this (case-insensitive).
    #[arg(long)]
    only: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = connect(&args.target).await?;
    let cases: Vec<_> = conformance::cases()
        .into_iter()
        .filter(|c| {
            args.only
                .as_deref()
                .is_none_or(|o| c.name.to_lowercase().contains(&o.to_lowercase()))
        })
        .collect();
    let report = conformance::run_suite(&client, &cases, |r| println!("{}", r.line())).await;
    println!("{}", report.summary());
    if report.failed() > 0 {
        std::process::exit(1);
    }
    Ok(())
}
