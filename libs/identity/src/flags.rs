//! The `--tls-cert --tls-key --tls-ca` flag triple: all three or none.

use std::path::PathBuf;

use crate::TlsError;

/// The three TLS flags every binary accepts (flatten into a clap parser with
/// `#[command(flatten)] tls: TlsFlags`). Environment variables mirror the flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct TlsFlags {
    /// PEM certificate chain of this process (leaf first); reloaded when the file changes.
    #[arg(long = "tls-cert", env = "BIGFLEET_TLS_CERT", value_name = "PATH")]
    pub cert: Option<PathBuf>,
    /// PEM private key matching --tls-cert; reloaded together with it.
    #[arg(long = "tls-key", env = "BIGFLEET_TLS_KEY", value_name = "PATH")]
    pub key: Option<PathBuf>,
    /// PEM CA bundle that peers' certificates must chain to (read once at startup).
    #[arg(long = "tls-ca", env = "BIGFLEET_TLS_CA", value_name = "PATH")]
    pub ca: Option<PathBuf>,
}

/// A complete set of TLS files: the process runs with mTLS on every edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
        }
    }
}

impl TlsFlags {
    /// `Ok(None)` ⇒ plaintext (no flag given), `Ok(Some)` ⇒ mTLS, and a partial set is an
    /// error naming the missing flags — a half-configured process must not silently come up
    /// in plaintext.
    pub fn resolve(&self) -> Result<Option<TlsFiles>, TlsError> {
        match (&self.cert, &self.key, &self.ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles::new(cert, key, ca))),
            _ => {
                let missing = [
                    ("--tls-cert", self.cert.is_none()),
                    ("--tls-key", self.key.is_none()),
                    ("--tls-ca", self.ca.is_none()),
                ]
                .into_iter()
                .filter_map(|(flag, absent)| absent.then_some(flag))
                .collect();
                Err(TlsError::PartialFlags { missing })
            }
        }
    }
}

impl From<TlsFiles> for TlsFlags {
    fn from(files: TlsFiles) -> Self {
        Self {
            cert: Some(files.cert),
            key: Some(files.key),
            ca: Some(files.ca),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        tls: TlsFlags,
    }

    fn flags(cert: bool, key: bool, ca: bool) -> TlsFlags {
        TlsFlags {
            cert: cert.then(|| "c.pem".into()),
            key: key.then(|| "k.pem".into()),
            ca: ca.then(|| "ca.pem".into()),
        }
    }

    #[test]
    fn none_means_plaintext_and_all_means_mtls() {
        assert_eq!(flags(false, false, false).resolve().unwrap(), None);
        assert_eq!(
            flags(true, true, true).resolve().unwrap(),
            Some(TlsFiles::new("c.pem", "k.pem", "ca.pem"))
        );
    }

    #[test]
    fn every_partial_combination_is_an_error_naming_what_is_missing() {
        let cases = [
            ((true, false, false), vec!["--tls-key", "--tls-ca"]),
            ((false, true, false), vec!["--tls-cert", "--tls-ca"]),
            ((false, false, true), vec!["--tls-cert", "--tls-key"]),
            ((true, true, false), vec!["--tls-ca"]),
            ((true, false, true), vec!["--tls-key"]),
            ((false, true, true), vec!["--tls-cert"]),
        ];
        for ((c, k, a), want) in cases {
            let err = flags(c, k, a).resolve().unwrap_err();
            let TlsError::PartialFlags { missing } = &err else {
                panic!("unexpected {err:?}");
            };
            assert_eq!(missing, &want);
            for flag in want {
                assert!(err.to_string().contains(flag), "{err}");
            }
        }
    }

    #[test]
    fn parses_from_the_command_line() {
        let cli = Cli::try_parse_from([
            "x",
            "--tls-cert",
            "a.crt",
            "--tls-key",
            "a.key",
            "--tls-ca",
            "ca.crt",
        ])
        .unwrap();
        assert_eq!(
            cli.tls.resolve().unwrap(),
            Some(TlsFiles::new("a.crt", "a.key", "ca.crt"))
        );
    }
}
