//! `bigfleet up --tls`: a throwaway CA and one certificate per role, written into the run
//! directory, exactly as the test suites mint them (libs/testkit).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_testkit::TestCa;

use super::UpError;

/// The local mesh's certificate authority and the role bundles issued so far.
pub struct Pki {
    dir: PathBuf,
    ca: TestCa,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("dir", &self.dir).finish()
    }
}

fn tls_err(e: impl std::fmt::Display) -> UpError {
    UpError::Tls(e.to_string())
}

impl Pki {
    /// A new CA whose files go to `dir` (created).
    pub fn create(dir: &Path) -> Result<Self, UpError> {
        std::fs::create_dir_all(dir).map_err(|source| UpError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let ca = TestCa::new("bigfleet-up-ca").map_err(tls_err)?;
        ca.write_ca(dir).map_err(tls_err)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues (or re-issues) `role`'s certificate and returns its files.
    pub fn files(&self, role: &str) -> Result<TlsFiles, UpError> {
        let p = self
            .ca
            .write_role_bundle(&self.dir, role)
            .map_err(tls_err)?;
        Ok(TlsFiles::new(p.cert, p.key, p.ca))
    }

    /// `--tls-cert C --tls-key K --tls-ca A` for a service running as `role`.
    pub fn flags(&self, role: &str) -> Result<Vec<String>, UpError> {
        let f = self.files(role)?;
        Ok(vec![
            "--tls-cert".into(),
            f.cert.display().to_string(),
            "--tls-key".into(),
            f.key.display().to_string(),
            "--tls-ca".into(),
            f.ca.display().to_string(),
        ])
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
}
