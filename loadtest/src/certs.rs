//! Certificates for load tests under mTLS: one cluster certificate per simulated operator.
//!
//! A TLS directory holds `ca.crt` and either ready-made `cluster-<id>.crt`/`.key` pairs
//! (file stems as [`role_file_stem`] names them) or the CA's key `ca.key`, from which
//! missing cluster certificates are minted on the fly with the production CA
//! ([`bigfleet_identity::ca`]: one identity URI SAN, loopback names, server + client
//! usages), so the load tools link no test code.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bigfleet_identity::ca::{CaError, CertificateAuthority, DEFAULT_CA_VALIDITY, LeafRequest};
use bigfleet_identity::{TlsContext, TlsFiles};

/// Errors preparing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate authority: {0}")]
    Ca(#[from] CaError),
    #[error("{dir}: no certificate for cluster {cluster} ({stem}.crt) and no ca.key to mint one")]
    Missing {
        dir: PathBuf,
        cluster: String,
        stem: String,
    },
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
}

pub use bigfleet_identity::ca::role_file_stem;

/// A CA loaded from (or created into) a TLS directory.
pub struct DirCa {
    dir: PathBuf,
    ca: Option<CertificateAuthority>,
}

impl std::fmt::Debug for DirCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirCa")
            .field("dir", &self.dir)
            .field("can_mint", &self.ca.is_some())
            .finish()
    }
}

impl DirCa {
    /// Opens `dir`; minting is possible when `ca.key` is present.
    pub fn open(dir: &Path) -> Result<Self, CertError> {
        let key_path = dir.join("ca.key");
        let ca = if key_path.exists() {
            Some(CertificateAuthority::load(&dir.join("ca.crt"), &key_path)?)
        } else {
            None
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
        })
    }

    /// Creates a fresh CA in `dir` (`ca.crt`, `ca.key`) plus a loopback server certificate
    /// `<server_role stem>.crt/.key` for the gateway (e.g. role `shard/shard-0`).
    pub fn create(dir: &Path, server_role: &str) -> Result<Self, CertError> {
        let io = |source| CertError::Write {
            path: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(io)?;
        let ca = CertificateAuthority::create("bigfleet load-test ca", DEFAULT_CA_VALIDITY)?;
        ca.write_ca(dir)?;
        let key_path = dir.join("ca.key");
        write_private(&key_path, &ca.key_pem())?;
        let ca = Self {
            dir: dir.to_path_buf(),
            ca: Some(ca),
        };
        ca.mint(server_role, &role_file_stem(server_role))?;
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
        if cert.exists() && key.exists() {
            return Ok(TlsFiles::new(cert, key, self.ca_path()));
        }
        self.mint(role, &stem)
    }

    /// A client config presenting `cluster`'s certificate.
    pub fn cluster_client_config(
        &self,
        cluster: &str,
    ) -> Result<Arc<rustls::ClientConfig>, CertError> {
        let files = self.role_files(&format!("cluster/{cluster}"))?;
        Ok(TlsContext::load(&files)?.client_config()?)
    }

    fn mint(&self, role: &str, stem: &str) -> Result<TlsFiles, CertError> {
        let ca = self.ca.as_ref().ok_or_else(|| CertError::Missing {
            dir: self.dir.clone(),
            cluster: role.to_owned(),
            stem: stem.to_owned(),
        })?;
        let request = LeafRequest::new(role)?.with_loopback();
        Ok(ca.issue_bundle(&request, &self.dir, stem)?)
    }
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, pem: &str) -> Result<(), CertError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(pem.as_bytes()).map_err(err)
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
    fn private_keys_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ca = DirCa::create(dir.path(), "shard/shard-0").unwrap();
        ca.role_files("cluster/c-1").unwrap();
        for key in ["ca.key", "shard-shard-0.key", "cluster-c-1.key"] {
            let mode = fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}: {mode:o}");
        }
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
