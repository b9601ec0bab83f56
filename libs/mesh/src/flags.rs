//! The flag group every long-running mesh service takes alike: how long it drains after
//! SIGTERM, its TLS files and its log format. One definition keeps the flag names,
//! environment variables and defaults the same in every binary.

use std::time::Duration;

use bigfleet_identity::TlsFlags;
use bigfleet_telemetry::LogArgs;

/// `--drain-timeout`, the `--tls-*` flags and `--log-format` (flatten with
/// `#[command(flatten)] service: ServiceFlags`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceFlags {
    /// Graceful-shutdown deadline after SIGTERM.
    #[arg(long, env = "BIGFLEET_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,

    #[command(flatten)]
    pub tls: TlsFlags,

    #[command(flatten)]
    pub log: LogArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        service: ServiceFlags,
    }

    #[test]
    fn defaults_and_overrides_parse_through_a_flattened_group() {
        let d = Cli::try_parse_from(["svc"]).unwrap().service;
        assert_eq!(d.drain_timeout, Duration::from_secs(10));
        assert_eq!(d.tls, TlsFlags::default());
        assert_eq!(d.log.log_format, bigfleet_telemetry::LogFormat::Text);

        let s = Cli::try_parse_from(["svc", "--drain-timeout", "3s", "--log-format", "json"])
            .unwrap()
            .service;
        assert_eq!(s.drain_timeout, Duration::from_secs(3));
        assert_eq!(s.log.log_format, bigfleet_telemetry::LogFormat::Json);
    }
}
