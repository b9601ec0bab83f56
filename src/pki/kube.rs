//! Just enough of the Kubernetes API for `bigfleet pki install-secrets`: get, create and
//! replace one Secret, over HTTPS/1.1 with the pod's service-account token (ADR-0110).
//!
//! In a pod: `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` say where the API server
//! is, and the service-account directory holds `token`, `ca.crt` (the API server's CA) and
//! `namespace`. Every request is one short-lived connection bounded by a timeout: the job
//! makes a few dozen calls, so pooling would buy nothing.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where a pod finds its service-account credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A failed Kubernetes API call, or a client that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("not running in a Kubernetes pod: {0}")]
    NotInCluster(String),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kubernetes api tls setup: {0}")]
    Tls(String),
    #[error("kubernetes api {method} {path}: {reason}")]
    Transport {
        method: Method,
        path: String,
        reason: String,
    },
    /// The API server answered with an error status; `message` is its Status message.
    #[error("kubernetes api {method} {path}: HTTP {status}: {message}")]
    Status {
        method: Method,
        path: String,
        status: StatusCode,
        message: String,
    },
}

impl KubeError {
    /// The HTTP status of an API error (409 = AlreadyExists / Conflict, 404 = NotFound).
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client for the Secrets of one API server.
#[derive(Clone)]
pub struct KubeClient {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    token: String,
    timeout: Duration,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl KubeClient {
    /// A client for the API server at `host:port` whose certificate chains to `ca_pem`,
    /// authenticating with the bearer `token`.
    pub fn new(
        host: &str,
        port: u16,
        ca_pem: &[u8],
        token: &str,
        timeout: Duration,
    ) -> Result<Self, KubeError> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.clone())
                .map_err(|e| KubeError::Tls(format!("api server name {host:?}: {e}")))?,
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            let cert = cert.map_err(|e| KubeError::Tls(format!("api server ca: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| KubeError::Tls(format!("api server ca: {e}")))?;
        }
        if roots.is_empty() {
            return Err(KubeError::Tls("api server ca: no certificate".into()));
        }
        let mut tls =
            rustls::ClientConfig::builder_with_provider(bigfleet_identity::crypto_provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| KubeError::Tls(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            host,
            port,
            server_name,
            tls: Arc::new(tls),
            token: token.trim().to_owned(),
            timeout,
        })
    }

    /// The in-cluster client: the API server from `KUBERNETES_SERVICE_HOST` / `_PORT`
    /// (looked up through `env`), credentials from `sa_dir`.
    pub fn in_cluster(
        env: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
        timeout: Duration,
    ) -> Result<Self, KubeError> {
        let host = env("KUBERNETES_SERVICE_HOST")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| KubeError::NotInCluster("KUBERNETES_SERVICE_HOST is not set".into()))?;
        let port = match env("KUBERNETES_SERVICE_PORT").filter(|p| !p.is_empty()) {
            None => 443,
            Some(p) => p.parse().map_err(|_| {
                KubeError::NotInCluster(format!("KUBERNETES_SERVICE_PORT {p:?} is not a port"))
            })?,
        };
        let token = read(&sa_dir.join("token"))?;
        let ca = read(&sa_dir.join("ca.crt"))?;
        Self::new(&host, port, &ca, &String::from_utf8_lossy(&token), timeout)
    }

    pub async fn get_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, KubeError> {
        match self
            .call(Method::GET, &secret_path(namespace, Some(name)), None)
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `secret`; HTTP 409 (already exists) comes back as [`KubeError::Status`].
    pub async fn create_secret(&self, namespace: &str, secret: &Value) -> Result<Value, KubeError> {
        self.call(Method::POST, &secret_path(namespace, None), Some(secret))
            .await
    }

    /// Replaces `secret` (carrying the `metadata.resourceVersion` it was read at, so a
    /// concurrent change fails with 409 instead of being overwritten).
    pub async fn replace_secret(
        &self,
        namespace: &str,
        name: &str,
        secret: &Value,
    ) -> Result<Value, KubeError> {
        self.call(
            Method::PUT,
            &secret_path(namespace, Some(name)),
            Some(secret),
        )
        .await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, KubeError> {
        let transport = |reason: String| KubeError::Transport {
            method: method.clone(),
            path: path.to_owned(),
            reason,
        };
        let (status, bytes) =
            tokio::time::timeout(self.timeout, self.exchange(&method, path, body))
                .await
                .map_err(|_| transport(format!("no answer within {:?}", self.timeout)))?
                .map_err(transport)?;
        if !status.is_success() {
            // API errors are a Status object; fall back to the raw body.
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
            return Err(KubeError::Status {
                method,
                path: path.to_owned(),
                status,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| transport(format!("response is not json: {e}")))
    }

    async fn exchange(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes), String> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connecting to {}:{}: {e}", self.host, self.port))?;
        let tls = TlsConnector::from(Arc::clone(&self.tls))
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("tls handshake with {}:{}: {e}", self.host, self.port))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let authority = match self.server_name {
            ServerName::IpAddress(_) if self.host.contains(':') => {
                format!("[{}]:{}", self.host, self.port)
            }
            _ => format!("{}:{}", self.host, self.port),
        };
        let payload = match body {
            Some(v) => Bytes::from(serde_json::to_vec(v).map_err(|e| e.to_string())?),
            None => Bytes::new(),
        };
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(header::HOST, authority)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(payload))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        driver.abort();
        Ok((status, bytes))
    }
}

fn secret_path(namespace: &str, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("/api/v1/namespaces/{namespace}/secrets/{name}"),
        None => format!("/api/v1/namespaces/{namespace}/secrets"),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KubeError> {
    std::fs::read(path).map_err(|source| KubeError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// The namespace of the pod this runs in (from the service-account directory).
pub fn own_namespace(sa_dir: &Path) -> Result<String, KubeError> {
    let ns = String::from_utf8_lossy(&read(&sa_dir.join("namespace"))?)
        .trim()
        .to_owned();
    if ns.is_empty() {
        return Err(KubeError::NotInCluster(format!(
            "{} is empty",
            sa_dir.join("namespace").display()
        )));
    }
    Ok(ns)
}
