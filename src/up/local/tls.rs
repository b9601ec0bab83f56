//! The `--tls` material: the flags that give a child its role certificate, the client
//! configuration a caller presents, and the URI scheme that follows from them.

use std::sync::Arc;

use super::{Mesh, UpError};
use crate::up::pki::Pki;

impl Mesh {
    pub(super) fn tls_flags(&self, role: &str) -> Result<Vec<String>, UpError> {
        match &self.pki {
            Some(p) => p.flags(role),
            None => Ok(Vec::new()),
        }
    }

    pub(super) fn scheme(&self) -> &'static str {
        if self.spec.tls { "https" } else { "http" }
    }

    /// TLS client configuration presenting `role` (None in plaintext meshes).
    pub fn client_tls(&self, role: &str) -> Result<Option<Arc<rustls::ClientConfig>>, UpError> {
        self.pki.as_ref().map(|p| p.client_config(role)).transpose()
    }

    /// The PKI of a `--tls` mesh.
    pub fn pki(&self) -> Option<&Pki> {
        self.pki.as_ref()
    }

    pub(super) fn tcp_target(&self, hostport: &str) -> String {
        format!("{}://{hostport}", self.scheme())
    }
}
