//! `provider-conformance --target ADDR`: runs the provider conformance suite against any
//! `bigfleet.v1alpha1.CapacityProvider` and prints one line per test and a summary.
//! Exits non-zero when a test fails. With `--tls-cert --tls-key --tls-ca` it dials with
//! mTLS, as a shard does, so a provider that requires client certificates needs no
//! plaintext listener for the run.

use std::path::PathBuf;

use bigfleet_fake_provider::{conformance, connect_with};
use bigfleet_identity::{TlsContext, TlsFlags};
use bigfleet_mesh::ChannelConfig;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "provider-conformance",
    about = "Provider conformance suite (docs/provider-guide.md, \"Running the conformance suite\")"
)]
struct Args {
    /// Provider address: `unix:///path.sock`, `http://host:port`, `https://host:port` (TLS
    /// required) or `host:port`.
    #[arg(long, env = "BIGFLEET_PROVIDER_TARGET")]
    target: String,
    /// Only run tests whose name contains this (case-insensitive).
    #[arg(long)]
    only: Option<String>,
    /// PEM client certificate to present (mTLS on TCP targets; all three --tls-* or none).
    #[arg(long = "tls-cert", env = "BIGFLEET_TLS_CERT", value_name = "PATH")]
    tls_cert: Option<PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(long = "tls-key", env = "BIGFLEET_TLS_KEY", value_name = "PATH")]
    tls_key: Option<PathBuf>,
    /// PEM CA bundle the provider's server certificate must chain to.
    #[arg(long = "tls-ca", env = "BIGFLEET_TLS_CA", value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// Name the provider's certificate is checked against (default: the target's host).
    #[arg(long = "tls-server-name", value_name = "NAME")]
    tls_server_name: Option<String>,
}

impl Args {
    /// Plaintext without --tls-* flags; a partial set is refused, as everywhere else.
    fn channel_config(&self) -> anyhow::Result<ChannelConfig> {
        let flags = TlsFlags {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
            ..TlsFlags::default()
        };
        let tls = match flags.resolve()? {
            None => None,
            Some(files) => Some(TlsContext::load(&files)?.client_config()?),
        };
        Ok(ChannelConfig {
            tls,
            server_name: self.tls_server_name.clone(),
            ..ChannelConfig::default()
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = connect_with(&args.target, &args.channel_config()?).await?;
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
