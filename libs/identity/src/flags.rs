//! The `--tls-cert --tls-key --tls-ca` flag triple (all three or none), the optional
//! `--tls-crl`, and `--insecure-plaintext`, the explicit opt-in to plaintext off loopback.

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
    /// PEM file of certificate revocation lists checked on every handshake, both ways;
    /// re-read when it changes. Needs the three --tls-* flags.
    #[arg(long = "tls-crl", env = "BIGFLEET_TLS_CRL", value_name = "PATH")]
    pub crl: Option<PathBuf>,
    /// Serve plaintext on non-loopback addresses. Without TLS flags every server refuses to
    /// start on such an address unless this is given (then it logs one WARN line saying what
    /// is exposed). Plaintext on loopback and Unix sockets needs no flag.
    #[arg(long = "insecure-plaintext", env = "BIGFLEET_INSECURE_PLAINTEXT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub insecure_plaintext: bool,
}

/// A complete set of TLS files: the process runs with mTLS on every edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    /// Revocation lists to check peers against (`--tls-crl`).
    pub crl: Option<PathBuf>,
}

impl TlsFiles {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            crl: None,
        }
    }

    /// Also checks peers against the CRLs in `crl`.
    pub fn with_crl(mut self, crl: impl Into<PathBuf>) -> Self {
        self.crl = Some(crl.into());
        self
    }
}

impl TlsFlags {
    /// `Ok(None)` ⇒ plaintext (no flag given), `Ok(Some)` ⇒ mTLS, and a partial set is an
    /// error naming the missing flags — a half-configured process must not silently come up
    /// in plaintext.
    pub fn resolve(&self) -> Result<Option<TlsFiles>, TlsError> {
        match (&self.cert, &self.key, &self.ca) {
            (None, None, None) if self.crl.is_some() => Err(TlsError::PartialFlags {
                missing: vec!["--tls-cert", "--tls-key", "--tls-ca"],
            }),
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                crl: self.crl.clone(),
                ..TlsFiles::new(cert, key, ca)
            })),
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
            crl: files.crl,
            insecure_plaintext: false,
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
            ..TlsFlags::default()
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
    fn a_crl_needs_the_tls_flags_and_travels_with_them() {
        let lone = TlsFlags {
            crl: Some("r.pem".into()),
            ..TlsFlags::default()
        };
        assert!(matches!(lone.resolve(), Err(TlsError::PartialFlags { .. })));
        let full = TlsFlags {
            crl: Some("r.pem".into()),
            ..flags(true, true, true)
        };
        assert_eq!(
            full.resolve().unwrap().unwrap().crl,
            Some(PathBuf::from("r.pem"))
        );
    }

    #[test]
    fn insecure_plaintext_is_off_unless_asked_for() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(!cli.tls.insecure_plaintext);
        let cli = Cli::try_parse_from(["x", "--insecure-plaintext"]).unwrap();
        assert!(cli.tls.insecure_plaintext);
        let cli = Cli::try_parse_from(["x", "--insecure-plaintext=false"]).unwrap();
        assert!(!cli.tls.insecure_plaintext);
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
