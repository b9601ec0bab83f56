//! A small HTTP/JSON API over the test hooks, for end-to-end tests that run the fake as a
//! separate process (`--admin-addr`). Never part of the provider contract.
//!
//! | method + path | body | effect |
//! |---|---|---|
//! | `GET /admin/stats` | | counts by state, revision, fence marks, operations |
//! | `GET /admin/machines/{id}` | | state, cluster, last_error, shard_metadata |
//! | `POST /admin/fail-machine` | `{"id", "reason"}` | FAILED now |
//! | `POST /admin/fail-next` | `{"id", "op", "style"?, "code"?, "message"?}` | next `op` call fails (`style` `reject` with `code` (default `internal`) or `fail`) |
//! | `POST /admin/complete` | `{"id"}` or `{"all": true}` | finish staged transitions |
//! | `POST /admin/ready` | `{"id"}` | node Ready (the original's ADR-0056 hold ends) |
//! | `POST /admin/require-readiness` | `{"id"}` | hold the next Configure |
//! | `POST /admin/remove` | `{"id"}` | machine vanishes |
//! | `POST /admin/shed-speculative` | `{"fraction"}` | drop Speculative slots |
//! | `POST /admin/set-allocatable` | `{"id", "allocatable": {..}}` | change allocatable |
//! | `POST /admin/add-catalog` | a catalog document | add its machines |
//! | `POST /admin/list-faults` | `{"faults": [..]?, "clear"?}` | the next Lists answer these ([`ListFault`]: `"unavailable"`, `"empty"`, `{"truncated": n}`, `"invalid"`), after `clear` drops those still queued; answers `{"pending", "list_calls"}` |
//! | `POST /admin/failure-rates` | `{"create"?, "configure"?, "drain"?, "delete"?, "style"?}` | change rates |
//!
//! Errors answer `{"error": "..."}` with 404 (unknown machine), 409 (wrong state) or 400.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bigfleet_proto::v1alpha1::MachineState;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{Catalog, FailureStyle, FakeProvider, Injection, ListFault, OpKind, ProviderError};

/// The admin routes over `provider`.
pub fn admin_router(provider: Arc<FakeProvider>) -> Router {
    Router::new()
        .route("/admin/stats", get(stats))
        .route("/admin/machines/{id}", get(machine))
        .route("/admin/fail-machine", post(fail_machine))
        .route("/admin/fail-next", post(fail_next))
        .route("/admin/complete", post(complete))
        .route("/admin/ready", post(ready))
        .route("/admin/require-readiness", post(require_readiness))
        .route("/admin/remove", post(remove))
        .route("/admin/shed-speculative", post(shed))
        .route("/admin/set-allocatable", post(set_allocatable))
        .route("/admin/add-catalog", post(add_catalog))
        .route("/admin/list-faults", post(list_faults))
        .route("/admin/failure-rates", post(failure_rates))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(provider)
}

type AppState = State<Arc<FakeProvider>>;

struct ApiError(StatusCode, String);

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        let status = match e {
            ProviderError::NotFound { .. } => StatusCode::NOT_FOUND,
            ProviderError::InvalidTransition { .. }
            | ProviderError::NotTransitional { .. }
            | ProviderError::AlreadyExists { .. } => StatusCode::CONFLICT,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

type ApiResult = Result<Json<serde_json::Value>, ApiError>;

fn ok() -> ApiResult {
    Ok(Json(json!({ "ok": true })))
}

/// What the admin API shows of a machine.
#[derive(Debug, Serialize)]
struct MachineView {
    id: String,
    state: String,
    cluster: String,
    last_error: String,
    instance_type: String,
    zone: String,
    shard_metadata: BTreeMap<String, String>,
}

fn view(m: bigfleet_proto::v1alpha1::Machine) -> MachineView {
    let state = MachineState::try_from(m.state)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| m.state.to_string());
    MachineView {
        id: m.id,
        state,
        cluster: m.cluster,
        last_error: m.last_error,
        instance_type: m.instance_type,
        zone: m.zone,
        shard_metadata: m.shard_metadata.into_iter().collect(),
    }
}

async fn stats(State(p): AppState) -> Json<crate::Stats> {
    Json(p.stats())
}

async fn machine(
    State(p): AppState,
    Path(id): Path<String>,
) -> Result<Json<MachineView>, ApiError> {
    Ok(Json(view(p.get(&id)?)))
}

#[derive(Deserialize)]
struct FailMachine {
    id: String,
    #[serde(default = "default_reason")]
    reason: String,
}

fn default_reason() -> String {
    "failed by the admin api".into()
}

async fn fail_machine(State(p): AppState, Json(b): Json<FailMachine>) -> ApiResult {
    p.fail_machine(&b.id, &b.reason)?;
    ok()
}

#[derive(Deserialize)]
struct FailNext {
    id: String,
    op: OpKind,
    #[serde(default)]
    style: Style,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Style {
    #[default]
    Reject,
    Fail,
}

/// A gRPC code by its snake_case or SCREAMING_SNAKE name (`unavailable`, `INTERNAL`).
pub fn parse_code(name: &str) -> Option<tonic::Code> {
    use tonic::Code::*;
    let all = [
        Ok,
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    ];
    let wanted: String = name
        .chars()
        .filter(|c| *c != '_')
        .collect::<String>()
        .to_lowercase();
    all.into_iter()
        .find(|c| format!("{c:?}").to_lowercase() == wanted)
}

async fn fail_next(State(p): AppState, Json(b): Json<FailNext>) -> ApiResult {
    let message = b
        .message
        .unwrap_or_else(|| format!("injected {} failure", b.op));
    let injection = match b.style {
        Style::Reject => {
            let code = match b.code.as_deref() {
                None => tonic::Code::Internal,
                Some(name) => parse_code(name).ok_or_else(|| {
                    ApiError(
                        StatusCode::BAD_REQUEST,
                        format!("unknown grpc code {name:?}"),
                    )
                })?,
            };
            Injection::Reject { code, message }
        }
        Style::Fail => Injection::Fail { message },
    };
    p.fail_next(&b.id, b.op, injection);
    ok()
}

/// More queued List faults than this is a mistake in the calling test, not a scenario.
const MAX_LIST_FAULTS: usize = 10_000;

#[derive(Deserialize)]
struct ListFaults {
    #[serde(default)]
    faults: Vec<ListFault>,
    #[serde(default)]
    clear: bool,
}

async fn list_faults(State(p): AppState, Json(b): Json<ListFaults>) -> ApiResult {
    if b.clear {
        p.clear_list_script();
    }
    if p.list_script_len() + b.faults.len() > MAX_LIST_FAULTS {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_LIST_FAULTS} list faults may be queued"),
        ));
    }
    p.script_lists(b.faults);
    Ok(Json(json!({
        "pending": p.list_script_len(),
        "list_calls": p.list_calls(),
    })))
}

#[derive(Deserialize)]
struct IdOrAll {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    all: bool,
}

async fn complete(State(p): AppState, Json(b): Json<IdOrAll>) -> ApiResult {
    match (b.id, b.all) {
        (_, true) => Ok(Json(json!({ "completed": p.complete_all() }))),
        (Some(id), false) => {
            p.complete_staged(&id)?;
            ok()
        }
        (None, false) => Err(ApiError(StatusCode::BAD_REQUEST, "give id or all".into())),
    }
}

#[derive(Deserialize)]
struct Id {
    id: String,
}

async fn ready(State(p): AppState, Json(b): Json<Id>) -> ApiResult {
    p.mark_ready(&b.id)?;
    ok()
}

async fn require_readiness(State(p): AppState, Json(b): Json<Id>) -> ApiResult {
    p.require_readiness(&b.id)?;
    ok()
}

async fn remove(State(p): AppState, Json(b): Json<Id>) -> ApiResult {
    p.remove_machine(&b.id)?;
    ok()
}

#[derive(Deserialize)]
struct Shed {
    fraction: f64,
}

async fn shed(State(p): AppState, Json(b): Json<Shed>) -> ApiResult {
    let removed = p.shed_speculative(b.fraction);
    Ok(Json(json!({ "removed": removed })))
}

#[derive(Deserialize)]
struct SetAllocatable {
    id: String,
    allocatable: BTreeMap<String, String>,
}

async fn set_allocatable(State(p): AppState, Json(b): Json<SetAllocatable>) -> ApiResult {
    p.set_allocatable(&b.id, b.allocatable)?;
    ok()
}

async fn add_catalog(State(p): AppState, Json(c): Json<Catalog>) -> ApiResult {
    let n = p
        .add_catalog(&c)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(Json(json!({ "added": n })))
}

#[derive(Deserialize)]
struct Rates {
    create: Option<f64>,
    configure: Option<f64>,
    drain: Option<f64>,
    delete: Option<f64>,
    style: Option<Style>,
}

async fn failure_rates(State(p): AppState, Json(b): Json<Rates>) -> ApiResult {
    let valid = |r: Option<f64>| r.is_none_or(|r| (0.0..=1.0).contains(&r));
    if ![b.create, b.configure, b.drain, b.delete]
        .into_iter()
        .all(valid)
    {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "rates must be in [0, 1]".into(),
        ));
    }
    p.update_config(|c| {
        let r = &mut c.failure_rates;
        r.create = b.create.unwrap_or(r.create);
        r.configure = b.configure.unwrap_or(r.configure);
        r.drain = b.drain.unwrap_or(r.drain);
        r.delete = b.delete.unwrap_or(r.delete);
        if let Some(style) = b.style {
            c.failure_style = match style {
                Style::Reject => FailureStyle::Reject,
                Style::Fail => FailureStyle::Fail,
            };
        }
    });
    ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn call(
        router: &Router,
        method: &str,
        path: &str,
        body: serde_json::Value,
    ) -> (StatusCode, serde_json::Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn hooks_over_http() {
        let p = Arc::new(FakeProvider::builtin());
        let r = admin_router(p.clone());
        let idle = p.ids_in_state(MachineState::Idle)[0].clone();

        let (s, _) = call(
            &r,
            "POST",
            "/admin/fail-machine",
            json!({"id": idle, "reason": "psu"}),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        let (s, v) = call(&r, "GET", &format!("/admin/machines/{idle}"), json!(null)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["state"], "MACHINE_STATE_FAILED");
        assert_eq!(v["last_error"], "psu");

        let (s, v) = call(&r, "POST", "/admin/fail-machine", json!({"id": "nope"})).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

        let spec = p.ids_in_state(MachineState::Speculative)[0].clone();
        let (s, _) = call(
            &r,
            "POST",
            "/admin/fail-next",
            json!({"id": spec, "op": "create", "code": "unavailable", "message": "quota"}),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        let err = p
            .create(&bigfleet_proto::v1alpha1::CreateRequest {
                machine_id: spec.clone(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert_eq!(err.to_string(), "quota");

        let (s, _) = call(
            &r,
            "POST",
            "/admin/fail-next",
            json!({"id": spec, "op": "create", "code": "bogus"}),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);

        let (s, v) = call(&r, "POST", "/admin/complete", json!({"id": spec})).await;
        assert_eq!(s, StatusCode::CONFLICT, "{v}");

        let (s, v) = call(&r, "GET", "/admin/stats", json!(null)).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["by_state"]["failed"], 1);

        let (s, _) = call(&r, "POST", "/admin/failure-rates", json!({"create": 2.0})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let (s, _) = call(
            &r,
            "POST",
            "/admin/failure-rates",
            json!({"drain": 0.5, "style": "fail"}),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(p.config().failure_rates.drain, 0.5);
        assert_eq!(p.config().failure_style, FailureStyle::Fail);
    }

    #[tokio::test]
    async fn list_faults_over_http() {
        let p = Arc::new(FakeProvider::builtin());
        let r = admin_router(p.clone());
        let (s, v) = call(
            &r,
            "POST",
            "/admin/list-faults",
            json!({"faults": ["unavailable", {"truncated": 2}, "empty", "invalid"]}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v, json!({"pending": 4, "list_calls": 0}));
        let filter = bigfleet_proto::v1alpha1::ListFilter::default();
        assert!(p.begin_list(&filter).is_err());
        let cut = p.begin_list(&filter).unwrap().unwrap();
        assert_eq!(cut.machines.len(), 2);

        let (s, v) = call(
            &r,
            "POST",
            "/admin/list-faults",
            json!({"faults": ["lying"]}),
        )
        .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        let (s, v) = call(
            &r,
            "POST",
            "/admin/list-faults",
            json!({"faults": vec!["empty"; MAX_LIST_FAULTS]}),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(p.list_script_len(), 2, "a refused call queues nothing");

        let (s, v) = call(&r, "POST", "/admin/list-faults", json!({"clear": true})).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v, json!({"pending": 0, "list_calls": 2}));
        assert!(p.begin_list(&filter).unwrap().is_none());
    }

    #[test]
    fn grpc_code_names() {
        assert_eq!(parse_code("unavailable"), Some(tonic::Code::Unavailable));
        assert_eq!(
            parse_code("RESOURCE_EXHAUSTED"),
            Some(tonic::Code::ResourceExhausted)
        );
        assert_eq!(
            parse_code("deadline_exceeded"),
            Some(tonic::Code::DeadlineExceeded)
        );
        assert_eq!(parse_code("nope"), None);
    }
}
