//! The HTTP side: a JSON API under `/api/v1` and the dashboard pages, both paginated (a
//! shard may hold 50K needs; no response carries more than [`MAX_PAGE_SIZE`] rows), plus
//! the sampled history (`/api/v1/history`, ADR-0136) and the dashboard's own stylesheet
//! and script under `/static/`.
//!
//! Every page goes out with a strict Content-Security-Policy ([`CONTENT_SECURITY_POLICY`]):
//! scripts, styles and fetches from this origin only, nothing inline, no framing.
//!
//! Served in plaintext even when the process runs mTLS, like the metrics port: browsers do
//! not present bigfleet client certificates. Put it behind an authenticating Ingress, or keep
//! the port in-cluster.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::error::InspectError;
use crate::fleet::{Fleet, FleetNeeds};
use crate::history::History;
use crate::html::pct;
use crate::pages::{self, Shell};
use crate::view::{
    ClusterNeedsView, ClusterView, DomainView, NeedRow, Page, ShardFetchView, ShardView,
    ShortfallView, SummaryView,
};

/// Sent with every response: the dashboard loads its stylesheet and its one script from
/// this origin, fetches only from it, and nothing inline runs.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// Rows per page unless asked otherwise.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// The most rows one response carries.
pub const MAX_PAGE_SIZE: usize = 500;

/// `GET /api/v1/shards`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardsResponse {
    pub computed_at_unix_nanos: i64,
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub shards: Page<ShardView>,
}

/// `GET /api/v1/shortfalls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShortfallsResponse {
    pub computed_at_unix_nanos: i64,
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub shortfalls: Page<ShortfallView>,
}

/// `GET /api/v1/domains`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainsResponse {
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub domains: Page<DomainView>,
}

/// `GET /api/v1/clusters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClustersResponse {
    pub computed_at_unix_nanos: i64,
    pub coordinator_error: String,
    pub shards: Vec<ShardFetchView>,
    pub clusters: Page<ClusterView>,
}

/// `GET /api/v1/actions`: recent actions over the fleet, newest first (ADR-0125).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionsResponse {
    pub actions: Vec<crate::view::ActionView>,
    pub unreachable: Vec<crate::view::ShardErrorView>,
}

/// `GET /api/v1/machines`: one page of machines in id order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachinesResponse {
    pub machines: Vec<crate::view::MachineView>,
    pub total_matching: u64,
    /// Pass as `after` for the next page; empty on the last.
    pub next_after: String,
    pub unreachable: Vec<crate::view::ShardErrorView>,
}

/// Filters of `/api/v1/actions` and `/api/v1/machines`.
#[derive(Debug, Default, Deserialize)]
pub struct FanoutQuery {
    cluster: Option<String>,
    shard: Option<String>,
    /// A duration back from now (`90s`, `1h`).
    since: Option<String>,
    limit: Option<String>,
    /// Machine state: value name (`MACHINE_STATE_IDLE`) or short (`idle`).
    state: Option<String>,
    after: Option<String>,
}

impl FanoutQuery {
    fn limit(&self) -> Result<u32, String> {
        match self.limit.as_deref() {
            None | Some("") => Ok(0),
            Some(v) => v
                .parse()
                .map_err(|_| format!("limit must be a non-negative integer (got {v:?})")),
        }
    }

    fn since_unix_nanos(&self) -> Result<i64, String> {
        match self.since.as_deref() {
            None | Some("") => Ok(0),
            Some(v) => {
                let back = humantime::parse_duration(v)
                    .map_err(|e| format!("since must be a duration like 1h ({e})"))?;
                let back = i64::try_from(back.as_nanos()).unwrap_or(i64::MAX);
                Ok(crate::fleet::now_unix_nanos().saturating_sub(back).max(0))
            }
        }
    }

    fn states(&self) -> Result<Vec<i32>, String> {
        match self.state.as_deref() {
            None | Some("") => Ok(Vec::new()),
            Some(v) => v
                .split(',')
                .map(|s| {
                    let name = s.trim().to_ascii_uppercase();
                    let name = if name.starts_with("MACHINE_STATE_") {
                        name
                    } else {
                        format!("MACHINE_STATE_{name}")
                    };
                    bigfleet_proto::v1alpha1::MachineState::from_str_name(&name)
                        .map(|s| s as i32)
                        .ok_or_else(|| format!("unknown machine state {s:?}"))
                })
                .collect(),
        }
    }
}

/// `{"error": "..."}` with a non-2xx status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: String,
}

/// Query parameters every list accepts. Strings, parsed by hand, so a bad value gets a clear
/// message instead of a generic rejection.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    page: Option<String>,
    page_size: Option<String>,
    unmet: Option<String>,
    id: Option<String>,
}

#[derive(Debug)]
struct Paging {
    page: usize,
    page_size: usize,
    unmet: bool,
}

impl ListQuery {
    /// [`paging`](Self::paging) for a dashboard page: a bad value is an HTML error page.
    fn page_paging(&self) -> Result<Paging, BadQuery> {
        self.paging().map_err(BadQuery::Page)
    }

    /// [`paging`](Self::paging) for the JSON API: a bad value is an [`ErrorResponse`].
    fn api_paging(&self) -> Result<Paging, BadQuery> {
        self.paging().map_err(BadQuery::Json)
    }

    fn paging(&self) -> Result<Paging, String> {
        let num = |name: &str, v: &Option<String>, default: usize| -> Result<usize, String> {
            match v.as_deref().map(str::trim) {
                None | Some("") => Ok(default),
                Some(s) => s
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name} must be a positive integer, got {s:?}")),
            }
        };
        let unmet = match self.unmet.as_deref().map(str::trim) {
            None | Some("") | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(other) => return Err(format!("unmet must be true or false, got {other:?}")),
        };
        Ok(Paging {
            page: num("page", &self.page, 1)?,
            page_size: num("page_size", &self.page_size, DEFAULT_PAGE_SIZE)?.min(MAX_PAGE_SIZE),
            unmet,
        })
    }
}

/// What every handler reads.
#[derive(Debug, Clone)]
pub struct AppState {
    pub fleet: Arc<Fleet>,
    pub history: Arc<History>,
    pub shell: Shell,
}

impl AppState {
    fn interval_ms(&self) -> u64 {
        u64::try_from(self.history.interval().as_millis()).unwrap_or(u64::MAX)
    }
}

type Shared = AppState;

/// A handler's answer; `?` on a bad query parameter answers 400 early.
type Reply = Result<Response, BadQuery>;

/// A query parameter that does not parse, answered in the route's own format.
#[derive(Debug)]
enum BadQuery {
    Page(String),
    Json(String),
}

impl IntoResponse for BadQuery {
    fn into_response(self) -> Response {
        match self {
            Self::Page(message) => page_error(StatusCode::BAD_REQUEST, "Bad request", &message),
            Self::Json(message) => json_error(StatusCode::BAD_REQUEST, &message),
        }
    }
}

/// The dashboard and the JSON API; pages refresh in place every `refresh` (zero: never).
pub fn router(fleet: Arc<Fleet>, history: Arc<History>, refresh: Duration) -> Router {
    let state = AppState {
        fleet,
        history,
        shell: Shell {
            refresh_secs: refresh.as_secs(),
        },
    };
    Router::new()
        .route("/", get(overview_page))
        .route("/clusters", get(clusters_page))
        .route("/clusters/{id}", get(cluster_page))
        .route("/shards/{id}", get(shard_page))
        .route("/static/dashboard.css", get(stylesheet))
        .route("/static/live.js", get(live_script))
        .route("/api/v1/history", get(api_history))
        .route("/api/v1/clusters/{id}/history", get(api_cluster_history))
        .route("/api/v1/shards/{id}/history", get(api_shard_history))
        .route("/cluster", get(cluster_lookup))
        .route("/shortfalls", get(shortfalls_page))
        .route("/domains", get(domains_page))
        .route("/actions", get(actions_page))
        .route("/machines", get(machines_page))
        .route("/api/v1/summary", get(api_summary))
        .route("/api/v1/shards", get(api_shards))
        .route("/api/v1/clusters", get(api_clusters))
        .route("/api/v1/clusters/{id}/needs", get(api_cluster_needs))
        .route("/api/v1/shortfalls", get(api_shortfalls))
        .route("/api/v1/domains", get(api_domains))
        .route("/api/v1/actions", get(api_actions))
        .route("/api/v1/machines", get(api_machines))
        .fallback(not_found)
        .with_state(state)
        .layer(axum::middleware::map_response(security_headers))
}

async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    r
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Versioned with the binary; a short cache keeps upgrades visible.
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", pages::STYLESHEET)
}

async fn live_script() -> Response {
    asset("text/javascript; charset=utf-8", pages::LIVE_SCRIPT)
}

// --- responses ---

fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &bigfleet_mesh::internal_message(&format_args!("encoding json: {e}")),
        ),
    }
}

fn json_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::to_vec(&ErrorResponse {
        error: message.to_owned(),
    })
    .unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A loaded value as JSON, or its failure as an [`ErrorResponse`].
fn json_answer<T: Serialize>(loaded: Result<T, (StatusCode, String)>) -> Response {
    match loaded {
        Ok(value) => json(&value),
        Err((status, message)) => json_error(status, &message),
    }
}

fn page_error(status: StatusCode, title: &str, message: &str) -> Response {
    (status, Html(pages::error(title, message))).into_response()
}

/// An error's HTTP status and message, from `bigfleet_mesh`'s one map (the same classes as
/// the gRPC side; internal detail is logged, never sent).
fn failure(e: &InspectError) -> (StatusCode, String) {
    let answer = bigfleet_mesh::http_error(e);
    (answer.status, answer.message)
}

/// A query parameter that does not parse, for the `load_*` functions both formats share.
fn bad_request(message: String) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, message)
}

fn html(body: String) -> Response {
    // Live data: never let a browser or proxy serve a stale copy on refresh.
    ([(header::CACHE_CONTROL, "no-store")], Html(body)).into_response()
}

async fn not_found() -> Response {
    page_error(StatusCode::NOT_FOUND, "Not found", "There is no such page.")
}

// --- shared assembly ---

fn cluster_needs_view(needs: &FleetNeeds, unmet_only: bool, p: &Paging) -> ClusterNeedsView {
    let unmet = needs.rows.iter().filter(|r| !r.view.satisfied).count();
    let selected: Vec<&crate::merge::ShardRow> = needs
        .rows
        .iter()
        .filter(|r| !unmet_only || !r.view.satisfied)
        .collect();
    // Only the served page is converted; the rest stay as the shards sent them.
    let page = Page::of(&selected, p.page, p.page_size)
        .map(|r| NeedRow::from_proto(Some(&r.shard_id), &r.view));
    ClusterNeedsView {
        cluster_id: needs.cluster_id.clone(),
        unmet_only,
        computed_at_unix_nanos: needs.computed_at_unix_nanos,
        coordinator_error: needs.coordinator_error.clone(),
        shards: needs.shards.clone(),
        satisfied: needs.rows.len() - unmet,
        unmet,
        needs: page,
    }
}

async fn load_cluster(
    fleet: &Fleet,
    id: &str,
    q: &ListQuery,
) -> Result<ClusterNeedsView, (StatusCode, String)> {
    let p = q.paging().map_err(bad_request)?;
    if id.trim().is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "cluster id must not be empty".to_owned(),
        ));
    }
    let needs = fleet.needs(id, 0).await.map_err(|e| failure(&e))?;
    Ok(cluster_needs_view(&needs, p.unmet, &p))
}

// --- pages ---

async fn overview_page(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.page_paging()?;
    let o = st.fleet.overview().await;
    Ok(html(pages::overview(
        st.shell,
        &o,
        &Page::of(&o.shards, p.page, p.page_size),
        &st.history.fleet(),
    )))
}

async fn shortfalls_page(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.page_paging()?;
    let o = st.fleet.overview().await;
    Ok(html(pages::shortfalls(
        st.shell,
        &o,
        &shortfall_page(&o, &p),
    )))
}

fn shortfall_page(o: &crate::fleet::FleetOverview, p: &Paging) -> Page<ShortfallView> {
    Page::of(&o.shortfalls, p.page, p.page_size).map(|s| ShortfallView::from_proto(&s))
}

async fn domains_page(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.page_paging()?;
    let o = st.fleet.overview().await;
    Ok(html(pages::domains(
        st.shell,
        &o,
        &Page::of(&o.domains, p.page, p.page_size),
    )))
}

async fn clusters_page(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.page_paging()?;
    Ok(match st.fleet.clusters().await {
        Ok(index) => html(pages::clusters(
            st.shell,
            &index,
            &Page::of(&index.clusters, p.page, p.page_size),
        )),
        Err(e) => {
            let (status, message) = failure(&e);
            page_error(status, "Clusters unavailable", &message)
        }
    })
}

async fn cluster_page(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    match load_cluster(&st.fleet, &id, &q).await {
        Ok(v) => {
            let history = st.history.cluster(&id);
            if history.is_none() && unknown_cluster(&v) {
                return page_error(
                    StatusCode::NOT_FOUND,
                    "Unknown cluster",
                    &format!(
                        "No shard holds demand from cluster {id:?}, and inspect has not sampled it within its history window. Check the name on the Clusters page."
                    ),
                );
            }
            html(pages::cluster(
                st.shell,
                &v,
                history.as_ref(),
                st.interval_ms(),
            ))
        }
        Err((status, e)) => page_error(status, "Cluster unavailable", &e),
    }
}

/// Sure to be unknown: every shard answered after at least one cycle, none holds a row of
/// it. (A shard that did not answer, or has not decided yet, might.)
fn unknown_cluster(v: &ClusterNeedsView) -> bool {
    v.satisfied + v.unmet == 0
        && !v.shards.is_empty()
        && v.shards.iter().all(|s| s.reachable && s.cycle > 0)
}

async fn shard_page(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    let o = st.fleet.overview().await;
    match o.shards.iter().find(|s| s.shard_id == id) {
        Some(sh) => html(pages::shard(
            st.shell,
            &o,
            sh,
            st.history.shard(&id).as_ref(),
            st.interval_ms(),
            &st.fleet.transfers(&id).await.map_err(|e| e.to_string()),
        )),
        None => page_error(
            StatusCode::NOT_FOUND,
            "Unknown shard",
            &format!(
                "The coordinator lists no shard {id:?}. The overview lists the shards it knows."
            ),
        ),
    }
}

async fn api_history(State(st): State<Shared>) -> Response {
    json(&st.history.fleet())
}

async fn api_cluster_history(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    match st.history.cluster(&id) {
        Some(h) => json(&h),
        None => json_error(
            StatusCode::NOT_FOUND,
            &format!(
                "cluster {id:?} is not tracked (never sampled, or beyond --history-max-clusters)"
            ),
        ),
    }
}

async fn api_shard_history(State(st): State<Shared>, Path(id): Path<String>) -> Response {
    match st.history.shard(&id) {
        Some(h) => json(&h),
        None => json_error(
            StatusCode::NOT_FOUND,
            &format!("shard {id:?} is not tracked (never sampled, or beyond --history-max-shards)"),
        ),
    }
}

/// The header form's target: `/cluster?id=X` ⇒ `/clusters/X`.
async fn cluster_lookup(Query(q): Query<ListQuery>) -> Response {
    match q.id.as_deref().map(str::trim) {
        Some(id) if !id.is_empty() => {
            Redirect::to(&format!("/clusters/{}", pct(id))).into_response()
        }
        _ => Redirect::to("/clusters").into_response(),
    }
}

// --- JSON API ---

fn unreachable_views(
    errors: &[bigfleet_proto::mesh::v1::ShardError],
) -> Vec<crate::view::ShardErrorView> {
    errors
        .iter()
        .map(crate::view::ShardErrorView::from_proto)
        .collect()
}

async fn load_actions(
    fleet: &Fleet,
    q: &FanoutQuery,
) -> Result<ActionsResponse, (StatusCode, String)> {
    let limit = q.limit().map_err(bad_request)?;
    let since = q.since_unix_nanos().map_err(bad_request)?;
    let req = bigfleet_proto::mesh::v1::RecentActionsRequest {
        cluster_id: q.cluster.clone().unwrap_or_default(),
        since_unix_nanos: since,
        limit,
        after_seq: 0,
        shard_id: q.shard.clone().unwrap_or_default(),
    };
    let r = fleet.recent_actions(&req).await.map_err(|e| failure(&e))?;
    Ok(ActionsResponse {
        actions: r
            .actions
            .iter()
            .map(crate::view::ActionView::from_proto)
            .collect(),
        unreachable: unreachable_views(&r.unreachable),
    })
}

async fn load_machines(
    fleet: &Fleet,
    q: &FanoutQuery,
) -> Result<MachinesResponse, (StatusCode, String)> {
    let limit = q.limit().map_err(bad_request)?;
    let states = q.states().map_err(bad_request)?;
    let req = bigfleet_proto::mesh::v1::ListMachinesRequest {
        cluster_id: q.cluster.clone().unwrap_or_default(),
        states,
        limit,
        after_machine_id: q.after.clone().unwrap_or_default(),
        shard_id: q.shard.clone().unwrap_or_default(),
    };
    let r = fleet.list_machines(&req).await.map_err(|e| failure(&e))?;
    Ok(MachinesResponse {
        machines: r
            .machines
            .iter()
            .map(crate::view::MachineView::from_proto)
            .collect(),
        total_matching: r.total_matching,
        next_after: r.next_after_machine_id,
        unreachable: unreachable_views(&r.unreachable),
    })
}

async fn api_actions(State(st): State<Shared>, Query(q): Query<FanoutQuery>) -> Response {
    json_answer(load_actions(&st.fleet, &q).await)
}

async fn api_machines(State(st): State<Shared>, Query(q): Query<FanoutQuery>) -> Response {
    json_answer(load_machines(&st.fleet, &q).await)
}

async fn actions_page(State(st): State<Shared>, Query(q): Query<FanoutQuery>) -> Response {
    match load_actions(&st.fleet, &q).await {
        Ok(v) => html(pages::actions(
            st.shell,
            &v,
            q.cluster.as_deref().unwrap_or(""),
            q.shard.as_deref().unwrap_or(""),
            &st.history.fleet(),
        )),
        Err((status, message)) => page_error(status, "Recent actions", &message),
    }
}

async fn machines_page(State(st): State<Shared>, Query(q): Query<FanoutQuery>) -> Response {
    match load_machines(&st.fleet, &q).await {
        Ok(v) => {
            // The filters the next-page link keeps.
            let mut keep = String::new();
            for (k, v) in [
                ("cluster", &q.cluster),
                ("state", &q.state),
                ("shard", &q.shard),
                ("limit", &q.limit),
            ] {
                if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                    keep.push_str(&format!("&{k}={}", pct(v)));
                }
            }
            html(pages::machines(
                st.shell,
                &v,
                &pages::MachineFilters {
                    cluster: q.cluster.as_deref().unwrap_or(""),
                    shard: q.shard.as_deref().unwrap_or(""),
                    state: q.state.as_deref().unwrap_or(""),
                    keep,
                },
            ))
        }
        Err((status, message)) => page_error(status, "Machines", &message),
    }
}

async fn api_summary(State(st): State<Shared>) -> Response {
    let summary: SummaryView = st.fleet.overview().await.summary();
    json(&summary)
}

async fn api_shards(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.api_paging()?;
    let o = st.fleet.overview().await;
    Ok(json(&ShardsResponse {
        computed_at_unix_nanos: o.computed_at_unix_nanos,
        coordinator_reachable: o.coordinator_reachable,
        coordinator_error: o.coordinator_error.clone(),
        shards: Page::of(&o.shards, p.page, p.page_size),
    }))
}

async fn api_clusters(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.api_paging()?;
    Ok(match st.fleet.clusters().await {
        Ok(index) => json(&ClustersResponse {
            computed_at_unix_nanos: index.computed_at_unix_nanos,
            coordinator_error: index.coordinator_error.clone(),
            shards: index.shards.clone(),
            clusters: Page::of(&index.clusters, p.page, p.page_size),
        }),
        Err(e) => {
            let (status, message) = failure(&e);
            json_error(status, &message)
        }
    })
}

async fn api_cluster_needs(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    json_answer(load_cluster(&st.fleet, &id, &q).await)
}

async fn api_shortfalls(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.api_paging()?;
    let o = st.fleet.overview().await;
    Ok(json(&ShortfallsResponse {
        computed_at_unix_nanos: o.computed_at_unix_nanos,
        coordinator_reachable: o.coordinator_reachable,
        coordinator_error: o.coordinator_error.clone(),
        shortfalls: shortfall_page(&o, &p),
    }))
}

async fn api_domains(State(st): State<Shared>, Query(q): Query<ListQuery>) -> Reply {
    let p = q.api_paging()?;
    let o = st.fleet.overview().await;
    Ok(json(&DomainsResponse {
        coordinator_reachable: o.coordinator_reachable,
        coordinator_error: o.coordinator_error.clone(),
        domains: Page::of(&o.domains, p.page, p.page_size),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(page: Option<&str>, size: Option<&str>, unmet: Option<&str>) -> ListQuery {
        ListQuery {
            page: page.map(Into::into),
            page_size: size.map(Into::into),
            unmet: unmet.map(Into::into),
            id: None,
        }
    }

    #[test]
    fn errors_get_the_mesh_http_status_and_no_internal_detail() {
        use crate::coordinator::{CoordinatorError, CoordinatorRpc};
        let call = |status: tonic::Status| {
            InspectError::Coordinator(CoordinatorError::Call {
                addr: "coord:7790".into(),
                rpc: CoordinatorRpc::ListShards,
                status,
            })
        };
        let cases = [
            (InspectError::InvalidArgument("bad id".into()), 400),
            (InspectError::AllShardsUnreachable("s1: down".into()), 503),
            (call(tonic::Status::unavailable("down")), 503),
            (call(tonic::Status::permission_denied("role")), 403),
        ];
        for (err, code) in cases {
            let msg = err.to_string();
            assert_eq!(failure(&err), (StatusCode::from_u16(code).unwrap(), msg));
        }
        let (status, message) = failure(&InspectError::Http(std::io::Error::other(
            "accept: /proc/self/fd exhausted",
        )));
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            message.starts_with(bigfleet_mesh::INTERNAL_MESSAGE) && !message.contains("proc"),
            "{message}"
        );
    }

    #[test]
    fn paging_defaults_caps_and_rejects_junk() {
        let p = q(None, None, None).paging().unwrap();
        assert_eq!(
            (p.page, p.page_size, p.unmet),
            (1, DEFAULT_PAGE_SIZE, false)
        );
        let big = q(Some("3"), Some("100000"), Some("true")).paging().unwrap();
        assert_eq!(
            (big.page, big.page_size, big.unmet),
            (3, MAX_PAGE_SIZE, true)
        );
        assert!(q(Some("0"), None, None).paging().is_err());
        assert!(
            q(Some("x"), None, None)
                .paging()
                .unwrap_err()
                .contains("page must be a positive integer")
        );
        assert!(q(None, None, Some("maybe")).paging().is_err());
    }
}
