//! `bigfleet up --tls`: a throwaway CA for this run and one certificate per role, written
//! into the run directory by the production CA of `bigfleet-identity` (the one behind
//! `bigfleet pki`, ADR-0110).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::ca::{CertificateAuthority, LeafRequest};
use bigfleet_identity::{TlsContext, TlsFiles};

use super::UpError;

/// Long enough for any local run; the CA dies with the run directory anyway.
const CA_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// The local mesh's certificate authority; role bundles are issued on demand.
pub struct Pki {
    dir: PathBuf,
    ca: CertificateAuthority,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish()
    }
}

fn tls_err(e: impl std::fmt::Display) -> UpError {
    UpError::Tls(e.to_string())
}

/// The `--tls-cert C --tls-key K --tls-ca A` arguments that point a process at `files`
/// (their revocation list, if any, is not passed).
pub fn tls_flags(files: &TlsFiles) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        files.cert.display().to_string(),
        "--tls-key".into(),
        files.key.display().to_string(),
        "--tls-ca".into(),
        files.ca.display().to_string(),
    ]
}

impl Pki {
    /// A new CA whose files go to `dir` (created; the CA key is never written).
    pub fn create(dir: &Path) -> Result<Self, UpError> {
        std::fs::create_dir_all(dir).map_err(|source| UpError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let ca = CertificateAuthority::create("bigfleet-up-ca", CA_VALIDITY).map_err(tls_err)?;
        ca.write_ca(dir).map_err(tls_err)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues (or re-issues) `role`'s certificate — `cluster/<id>`, `shard/<id>`,
    /// `shard/<id>/execute`, `coordinator/<id>`, `admin`, `readonly` — valid for the
    /// loopback names every local service listens on, and returns its files.
    pub fn files(&self, role: &str) -> Result<TlsFiles, UpError> {
        let request = LeafRequest::new(role).map_err(tls_err)?.with_loopback();
        self.ca
            .issue_bundle(
                &request,
                &self.dir,
                &bigfleet_identity::ca::role_file_stem(role),
            )
            .map_err(tls_err)
    }

    /// `--tls-cert C --tls-key K --tls-ca A` for a service running as `role`.
    pub fn flags(&self, role: &str) -> Result<Vec<String>, UpError> {
        Ok(tls_flags(&self.files(role)?))
    }

    /// A client configuration presenting `role` (operators, the progress view).
    pub fn client_config(&self, role: &str) -> Result<Arc<rustls::ClientConfig>, UpError> {
        TlsContext::load(&self.files(role)?)
            .and_then(|c| c.client_config())
            .map_err(tls_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_identity::ca::CertInfo;

    #[test]
    fn role_bundles_carry_the_role() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let flags = pki.flags("shard/shard-0").unwrap();
        assert_eq!(flags.len(), 6);
        assert!(Path::new(&flags[1]).exists());
        let ctx = TlsContext::load(&pki.files("shard/shard-0/execute").unwrap()).unwrap();
        assert_eq!(
            ctx.own_identity().unwrap(),
            bigfleet_identity::PeerIdentity::ShardExecute("shard-0".into())
        );
        assert!(pki.client_config("readonly").is_ok());
    }

    #[test]
    fn coordinator_replicas_get_their_own_identity() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::create(dir.path()).unwrap();
        let files = pki.files("coordinator/coord-0").unwrap();
        assert_eq!(files.cert, dir.path().join("coordinator-coord-0.crt"));
        let info = CertInfo::from_pem(&std::fs::read_to_string(&files.cert).unwrap()).unwrap();
        assert_eq!(info.identity_uris, vec!["bigfleet://coordinator/coord-0"]);
        assert!(info.dns_names.contains(&"localhost".to_owned()));
        assert!(
            !dir.path().join("ca.key").exists(),
            "the CA key stays in memory"
        );
        assert!(pki.files("not a role").is_err());
    }
}
