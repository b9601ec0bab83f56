//! A scripted gateway `Relay`: bootstrap blobs and reclaim delivery.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::relay_server::{Relay, RelayServer};
use bigfleet_proto::mesh::v1::request_bootstrap_response::Outcome as Reply;
use parking_lot::Mutex;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

use super::{Served, serve_uds};
use crate::links::GatewayLink;
use bigfleet_mesh::MAX_MESSAGE_SIZE;

/// How the double answers a RequestBootstrap.
#[derive(Debug, Clone, PartialEq)]
pub enum BlobScript {
    /// A blob (after `delay`).
    Blob { data: Vec<u8>, delay: Duration },
    /// BOOTSTRAP_ERROR_NO_SESSION.
    NoSession,
    /// BOOTSTRAP_ERROR_TIMEOUT, answered after the request's own timeout, as
    /// the real gateway does when the operator stays silent.
    Timeout,
    /// BOOTSTRAP_ERROR_OPERATOR_ERROR with the operator's message.
    OperatorError(String),
    /// Never answers (a hung gateway): the worker's own clock must end it.
    Hang,
    /// The gateway itself fails with this code.
    Fail(Code),
}

impl BlobScript {
    pub fn blob(data: &[u8]) -> Self {
        BlobScript::Blob {
            data: data.to_vec(),
            delay: Duration::ZERO,
        }
    }
}

/// One RequestBootstrap the double received.
#[derive(Debug, Clone, PartialEq)]
pub struct BootstrapCall {
    pub cluster_id: String,
    pub machine_id: String,
    pub need_fingerprint: String,
    pub timeout_ms: u32,
    pub requirements: usize,
    /// `traceparent` of the call's metadata, when it came over gRPC.
    pub traceparent: Option<String>,
}

/// One SendReclaim the double received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReclaimCall {
    pub request: mesh::SendReclaimRequest,
}

#[derive(Debug)]
struct State {
    default: BlobScript,
    per_cluster: HashMap<String, BlobScript>,
    reclaim_delivered: bool,
    bootstraps: Vec<BootstrapCall>,
    reclaims: Vec<ReclaimCall>,
    next_id: u64,
}

/// A Gateway double. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct GatewayDouble {
    state: Arc<Mutex<State>>,
}

impl Default for GatewayDouble {
    fn default() -> Self {
        Self::new(BlobScript::blob(b"#cloud-config\n"))
    }
}

impl GatewayDouble {
    /// Answers every cluster with `default` unless scripted otherwise.
    pub fn new(default: BlobScript) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                default,
                per_cluster: HashMap::new(),
                reclaim_delivered: true,
                bootstraps: Vec::new(),
                reclaims: Vec::new(),
                next_id: 1,
            })),
        }
    }

    pub fn script(&self, cluster: &str, script: BlobScript) {
        self.state
            .lock()
            .per_cluster
            .insert(cluster.to_owned(), script);
    }

    /// Whether SendReclaim reports the instruction delivered (a session exists).
    pub fn set_reclaim_delivered(&self, delivered: bool) {
        self.state.lock().reclaim_delivered = delivered;
    }

    pub fn bootstraps(&self) -> Vec<BootstrapCall> {
        self.state.lock().bootstraps.clone()
    }

    pub fn reclaims(&self) -> Vec<ReclaimCall> {
        self.state.lock().reclaims.clone()
    }

    async fn answer(
        &self,
        req: mesh::RequestBootstrapRequest,
        traceparent: Option<String>,
    ) -> Result<mesh::RequestBootstrapResponse, Status> {
        let (script, request_id) = {
            let mut st = self.state.lock();
            st.bootstraps.push(BootstrapCall {
                cluster_id: req.cluster_id.clone(),
                machine_id: req.machine_id.clone(),
                need_fingerprint: req.need_fingerprint.clone(),
                timeout_ms: req.timeout_ms,
                requirements: req.requirements.len(),
                traceparent,
            });
            let id = st.next_id;
            st.next_id += 1;
            let script = st
                .per_cluster
                .get(&req.cluster_id)
                .unwrap_or(&st.default)
                .clone();
            (script, format!("{id:016x}"))
        };
        let wait = if req.timeout_ms == 0 {
            Duration::from_secs(30)
        } else {
            Duration::from_millis(u64::from(req.timeout_ms))
        };
        let error = |e: mesh::BootstrapError, message: &str| mesh::RequestBootstrapResponse {
            outcome: Some(Reply::Error(e as i32)),
            message: message.to_owned(),
            ttl_seconds: 0,
            request_id: request_id.clone(),
        };
        match script {
            BlobScript::Blob { data, delay } => {
                tokio::time::sleep(delay).await;
                Ok(mesh::RequestBootstrapResponse {
                    outcome: Some(Reply::Blob(data)),
                    message: String::new(),
                    ttl_seconds: 600,
                    request_id,
                })
            }
            BlobScript::NoSession => Ok(error(
                mesh::BootstrapError::NoSession,
                "cluster has no session",
            )),
            BlobScript::Timeout => {
                tokio::time::sleep(wait).await;
                Ok(error(
                    mesh::BootstrapError::Timeout,
                    "operator did not answer in time",
                ))
            }
            BlobScript::OperatorError(m) => Ok(error(mesh::BootstrapError::OperatorError, &m)),
            BlobScript::Hang => std::future::pending().await,
            BlobScript::Fail(code) => Err(Status::new(code, "gateway double failure")),
        }
    }

    fn reclaim(&self, req: mesh::SendReclaimRequest) -> mesh::SendReclaimResponse {
        let mut st = self.state.lock();
        st.reclaims.push(ReclaimCall {
            request: req.clone(),
        });
        let delivered = st.reclaim_delivered;
        let id = st.next_id;
        st.next_id += 1;
        mesh::SendReclaimResponse {
            delivered,
            instruction_id: if delivered {
                format!("{id:016x}")
            } else {
                String::new()
            },
        }
    }

    /// A tonic router serving this double as `bigfleet.mesh.v1.Relay`.
    pub fn router(&self) -> tonic::transport::server::Router {
        Server::builder().add_service(
            RelayServer::new(GatewayService {
                double: self.clone(),
            })
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
        )
    }

    pub fn serve_uds(&self, path: &Path) -> std::io::Result<Served> {
        serve_uds(self.router(), path)
    }
}

impl GatewayLink for GatewayDouble {
    async fn request_bootstrap(
        &self,
        req: mesh::RequestBootstrapRequest,
        _timeout: Duration,
    ) -> Result<mesh::RequestBootstrapResponse, Status> {
        self.answer(req, None).await
    }

    async fn send_reclaim(
        &self,
        req: mesh::SendReclaimRequest,
        _timeout: Duration,
    ) -> Result<mesh::SendReclaimResponse, Status> {
        Ok(self.reclaim(req))
    }
}

struct GatewayService {
    double: GatewayDouble,
}

#[tonic::async_trait]
impl Relay for GatewayService {
    async fn request_bootstrap(
        &self,
        request: Request<mesh::RequestBootstrapRequest>,
    ) -> Result<Response<mesh::RequestBootstrapResponse>, Status> {
        let traceparent = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.double
            .answer(request.into_inner(), traceparent)
            .await
            .map(Response::new)
    }

    async fn send_reclaim(
        &self,
        request: Request<mesh::SendReclaimRequest>,
    ) -> Result<Response<mesh::SendReclaimResponse>, Status> {
        Ok(Response::new(self.double.reclaim(request.into_inner())))
    }
}
