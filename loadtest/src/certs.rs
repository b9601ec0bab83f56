//! Certificates for load tests under mTLS: one cluster certificate per simulated operator.
//!
//! A TLS directory holds `ca.crt` and either ready-made `cluster-<id>.crt`/`.key` pairs
//! (file names as `bigfleet_testkit::role_file_stem` writes them) or the CA's key
//! `ca.key`, from which missing cluster certificates are minted on the fly.
//! `bigfleet_testkit::TestCa` cannot be rebuilt from files, so minting from a stored CA key
//! is done here with rcgen, with the same leaf shape testkit issues (one identity URI SAN,
//! loopback names, server + client EKUs).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_testkit::{LeafSpec, ca_params, role_file_stem};
use rcgen::{CertifiedIssuer, Issuer, KeyPair};

/// Errors preparing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{dir}: no certificate for cluster {cluster} ({stem}.crt) and no ca.key to mint one")]
    Missing {
        dir: PathBuf,
        cluster: String,
        stem: String,
    },
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
}

/// A CA loaded from (or created into) a TLS directory.
pub struct DirCa {
    dir: PathBuf,
    issuer: Option<Issuer<'static, KeyPair>>,
}

impl std::fmt::Debug for DirCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirCa")
            .field("dir", &self.dir)
            .field("can_mint", &self.issuer.is_some())
            .finish()
    }
}

fn read(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|source| CertError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, content: &str, mode: u32) -> Result<(), CertError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| CertError::Write {
        path: path.to_path_buf(),
        source,
    };
    fs::write(path, content).map_err(err)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(err)
}

impl DirCa {
    /// Opens `dir`; minting is possible when `ca.key` is present.
    pub fn open(dir: &Path) -> Result<Self, CertError> {
        let key_path = dir.join("ca.key");
        let issuer = if key_path.exists() {
            let key = KeyPair::from_pem(&read(&key_path)?)?;
            Some(Issuer::from_ca_cert_pem(&read(&dir.join("ca.crt"))?, key)?)
        } else {
            None
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            issuer,
        })
    }

    /// Creates a fresh CA in `dir` (`ca.crt`, `ca.key`) plus a loopback server certificate
    /// `<server_role stem>.crt/.key` for the gateway (e.g. role `shard/shard-0`).
    pub fn create(dir: &Path, server_role: &str) -> Result<Self, CertError> {
        fs::create_dir_all(dir).map_err(|source| CertError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params("bigfleet load-test ca"), key)?;
        write(&dir.join("ca.crt"), &ca.pem(), 0o644)?;
        write(&dir.join("ca.key"), &key_pem, 0o600)?;
        let ca = Self::open(dir)?;
        ca.mint(&LeafSpec::role(server_role), &role_file_stem(server_role))?;
        Ok(ca)
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The TLS files of `role` (e.g. `cluster/a`), minting them if missing and possible.
    pub fn role_files(&self, role: &str) -> Result<TlsFiles, CertError> {
        let stem = role_file_stem(role);
        let cert = self.dir.join(format!("{stem}.crt"));
        let key = self.dir.join(format!("{stem}.key"));
        if !(cert.exists() && key.exists()) {
            if self.issuer.is_none() {
                return Err(CertError::Missing {
                    dir: self.dir.clone(),
                    cluster: role.to_owned(),
                    stem,
                });
            }
            self.mint(&LeafSpec::role(role), &stem)?;
        }
        Ok(TlsFiles::new(cert, key, self.ca_path()))
    }

    /// A client config presenting `cluster`'s certificate.
    pub fn cluster_client_config(
        &self,
        cluster: &str,
    ) -> Result<Arc<rustls::ClientConfig>, CertError> {
        let files = self.role_files(&format!("cluster/{cluster}"))?;
        Ok(TlsContext::load(&files)?.client_config()?)
    }

    fn mint(&self, spec: &LeafSpec, stem: &str) -> Result<(), CertError> {
        let issuer = self.issuer.as_ref().ok_or_else(|| CertError::Missing {
            dir: self.dir.clone(),
            cluster: spec.common_name.clone(),
            stem: stem.to_owned(),
        })?;
        let params = spec.params()?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, issuer)?;
        write(&self.dir.join(format!("{stem}.crt")), &cert.pem(), 0o644)?;
        write(
            &self.dir.join(format!("{stem}.key")),
            &key.serialize_pem(),
            0o600,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_identity::PeerIdentity;

    #[test]
    fn minted_cluster_certificates_carry_the_cluster_identity() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DirCa::create(dir.path(), "shard/shard-0").unwrap();
        assert!(dir.path().join("shard-shard-0.crt").exists());
        let files = ca.role_files("cluster/c-7").unwrap();
        let ctx = TlsContext::load(&files).unwrap();
        assert_eq!(
            ctx.own_identity().unwrap(),
            PeerIdentity::Cluster("c-7".into())
        );
        // A reopened directory mints with the same CA (the chain still verifies in the
        // handshake tests; here the issuer must at least load).
        let again = DirCa::open(dir.path()).unwrap();
        assert!(again.role_files("cluster/c-8").is_ok());
    }

    #[test]
    fn without_a_ca_key_missing_certificates_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        DirCa::create(dir.path(), "shard/shard-0").unwrap();
        fs::remove_file(dir.path().join("ca.key")).unwrap();
        let ca = DirCa::open(dir.path()).unwrap();
        let err = ca.role_files("cluster/x").unwrap_err();
        assert!(matches!(err, CertError::Missing { .. }), "{err}");
    }
}
