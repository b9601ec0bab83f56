//! `bigfleet-fake-provider`: parses flags and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bigfleet_fake_provider::run(bigfleet_fake_provider::cli::Args::parse()).await
}
