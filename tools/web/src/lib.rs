//! A dashboard for ruststream's tables, served by [axum](https://docs.rs/axum).
//!
//! A [`Dashboard`] lists tables registered with the broker that serves them
//! ([`Dashboard::table`]). Its page shows, for each table, the rows due, scheduled, in work
//! and failed and the age of the oldest due row, now and over time as charts, beside the rows
//! processed and failed per second (the dashboard samples the counts every
//! [`Dashboard::sample_every`] and keeps the last [`Dashboard::history`] samples in memory),
//! and the failed rows with their error, attempt and payload. A dashboard given a token
//! ([`Dashboard::token`]) shows redrive and delete buttons, which send the token typed into
//! the page; without a token it is read-only.
//!
//! A service mounts the dashboard's [`Dashboard::router`] in its own axum router, or runs it
//! alone on an address ([`Dashboard::serve`]):
//!
//! ```no_run
//! # async fn run(handle: ruststream::BrokerHandle<impl ruststream::adapter::Adapter>) -> std::io::Result<()> {
//! # #[derive(ruststream::Inbox)]
//! # #[inbox(table = "jobs", failed_at = "failed_at", error = "error")]
//! # struct Job { #[field(id, generated)] id: i64 }
//! use ruststream_web::Dashboard;
//!
//! Dashboard::new()
//!     .table::<Job, _>(handle)
//!     .token(std::env::var("DASHBOARD_TOKEN").expect("a token"))
//!     .serve("127.0.0.1:8080")
//!     .await
//! # }
//! ```
//!
//! # The HTTP API
//!
//! The page reads the same JSON API a tool may call:
//!
//! | request | answer |
//! | --- | --- |
//! | `GET api/tables` | `{"tables": [..]}`: each table's counts now |
//! | `GET api/tables/{table}/history` | the table's samples, oldest first |
//! | `GET api/tables/{table}/failed?limit=&after=` | a page of failed rows in id order, after the id `after` |
//! | `POST api/tables/{table}/failed/{id}/redrive` | returns the failed row to the queue |
//! | `POST api/tables/{table}/failed/{id}/delete` | deletes the failed row |
//!
//! An id in a path is an integer where it parses as one, else text. The two `POST` requests
//! change a row only with the header `Authorization: Bearer <token>` naming the dashboard's
//! token, compared in constant time: without the header they answer 401, with another token
//! 403, and on a dashboard without a token always 403.

mod auth;
mod history;
mod source;

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ruststream::adapter::Adapter;
use ruststream::core::spec::Described;
use ruststream::{BrokerHandle, Count, FailedRow, InboxTable, PublishError, Stats, Value};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::{Refusal, Token};
use crate::history::{Ring, Sample, duration_ms};
use crate::source::{Source, TableSource};

/// How often the counts are sampled unless [`Dashboard::sample_every`] says otherwise.
pub const DEFAULT_SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How many samples each table keeps unless [`Dashboard::history`] says otherwise: an hour
/// at the default interval.
pub const DEFAULT_HISTORY: usize = 720;
/// How many failed rows a page lists unless the request's `limit` says otherwise.
pub const DEFAULT_PAGE: u32 = 50;
/// The most failed rows a page lists.
pub const MAX_PAGE: u32 = 500;

const PAGE: &str = include_str!("../assets/page.html");
const SCRIPT: &str = include_str!("../assets/dashboard.js");
const STYLE: &str = include_str!("../assets/dashboard.css");

/// A dashboard of ruststream tables: built with the tables it shows, then mounted
/// ([`Dashboard::router`]) or served alone ([`Dashboard::serve`]).
pub struct Dashboard {
    tables: Vec<(&'static str, Arc<dyn TableSource>)>,
    token: Option<String>,
    title: String,
    sample_every: Duration,
    history: usize,
    shared: OnceLock<Arc<Shared>>,
}

impl Default for Dashboard {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field(
                "tables",
                &self
                    .tables
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>(),
            )
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("title", &self.title)
            .field("sample_every", &self.sample_every)
            .field("history", &self.history)
            .finish()
    }
}

impl Dashboard {
    /// A dashboard of no table yet, read-only, sampling every [`DEFAULT_SAMPLE_EVERY`].
    pub fn new() -> Self {
        Self {
            tables: Vec::new(),
            token: None,
            title: "ruststream".to_owned(),
            sample_every: DEFAULT_SAMPLE_EVERY,
            history: DEFAULT_HISTORY,
            shared: OnceLock::new(),
        }
    }

    /// Shows `T`'s table, read and changed through the broker `handle` (a clone of the
    /// service's handle); a second table of the same name replaces the first.
    pub fn table<T: InboxTable, A: Adapter>(mut self, handle: BrokerHandle<A>) -> Self {
        let name = T::TABLE.table_desc().table;
        let source: Arc<dyn TableSource> = Arc::new(Source::<T, A>::new(handle));
        match self.tables.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = source,
            None => self.tables.push((name, source)),
        }
        self.shared = OnceLock::new();
        self
    }

    /// The token that the redrive and delete requests must carry as
    /// `Authorization: Bearer <token>`. Without one the dashboard is read-only: the page
    /// shows no button and those requests answer 403.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then_some(token);
        self.shared = OnceLock::new();
        self
    }

    /// The page's title: `ruststream` unless given.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self.shared = OnceLock::new();
        self
    }

    /// How often the counts of every table are sampled for the chart (at least every 100
    /// ms); the page refreshes as often, at most once a second.
    pub fn sample_every(mut self, every: Duration) -> Self {
        self.sample_every = every.max(Duration::from_millis(100));
        self.shared = OnceLock::new();
        self
    }

    /// How many samples each table keeps (at least one).
    pub fn history(mut self, samples: usize) -> Self {
        self.history = samples.max(1);
        self.shared = OnceLock::new();
        self
    }

    /// The dashboard's routes (its page at `/`, its API under `/api`), to serve alone or to
    /// [`Router::nest`] under a path of the service's own. Sampling starts here within a tokio
    /// runtime, else at the first request, and stops when every router of it is dropped.
    pub fn router(&self) -> Router {
        let shared = self.shared().clone();
        shared.start_sampling();
        Router::new()
            .route("/", get(page))
            .route("/dashboard.js", get(script))
            .route("/dashboard.css", get(style))
            .route("/api/tables", get(tables))
            .route("/api/tables/{table}/history", get(history))
            .route("/api/tables/{table}/failed", get(failed))
            .route("/api/tables/{table}/failed/{id}/redrive", post(redrive))
            .route("/api/tables/{table}/failed/{id}/delete", post(delete))
            .with_state(shared)
    }

    /// Serves the dashboard alone on `addr` until the process ends.
    pub async fn serve(self, addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        self.serve_on(listener).await
    }

    /// Serves the dashboard alone on a bound listener until the process ends.
    pub async fn serve_on(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        axum::serve(listener, self.router()).into_future().await
    }

    fn shared(&self) -> &Arc<Shared> {
        self.shared.get_or_init(|| {
            Arc::new(Shared {
                tables: self
                    .tables
                    .iter()
                    .map(|(name, source)| Table {
                        name,
                        source: source.clone(),
                        history: Mutex::new(Ring::new(self.history)),
                    })
                    .collect(),
                token: self.token.as_deref().map(Token::new),
                title: self.title.clone(),
                sample_every: self.sample_every,
                sampling: AtomicBool::new(false),
            })
        })
    }
}

/// What the dashboard's routes share.
pub(crate) struct Shared {
    pub(crate) tables: Vec<Table>,
    token: Option<Token>,
    title: String,
    sample_every: Duration,
    sampling: AtomicBool,
}

/// One table the dashboard shows.
pub(crate) struct Table {
    pub(crate) name: &'static str,
    pub(crate) source: Arc<dyn TableSource>,
    pub(crate) history: Mutex<Ring>,
}

impl Shared {
    /// Starts the sampler once, where a tokio runtime runs.
    fn start_sampling(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sampling.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(history::sample(Arc::downgrade(self), self.sample_every));
    }

    fn table(&self, name: &str) -> Result<&Table, ApiError> {
        self.tables
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("no table `{name}`")))
    }
}

/// An error answered as `{"error": ..}` with its status.
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

impl From<PublishError> for ApiError {
    fn from(error: PublishError) -> Self {
        let status = match error {
            PublishError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            PublishError::Invalid(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.to_string())
    }
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::ReadOnly => Self::new(
                StatusCode::FORBIDDEN,
                "the dashboard is read-only: it has no token",
            ),
            Refusal::Missing => Self::new(
                StatusCode::UNAUTHORIZED,
                "the request carries no `Authorization: Bearer` token",
            ),
            Refusal::Wrong => Self::new(StatusCode::FORBIDDEN, "the token is not the dashboard's"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A count as the API answers it.
#[derive(Serialize)]
struct CountJson {
    /// The rows counted; at least this many where not exact.
    value: u64,
    /// Whether every row was counted.
    exact: bool,
    /// The count as shown: `100000+` where not exact.
    text: String,
}

impl From<Count> for CountJson {
    fn from(count: Count) -> Self {
        Self {
            value: count.value(),
            exact: count.is_exact(),
            text: count.to_string(),
        }
    }
}

/// One table's counts as `GET /api/tables` answers them.
#[derive(Serialize)]
struct TableJson {
    table: &'static str,
    due: Option<CountJson>,
    scheduled: Option<CountJson>,
    in_work: Option<CountJson>,
    failed: Option<CountJson>,
    processed: Option<CountJson>,
    oldest_due_age_ms: Option<u64>,
    at_ms: Option<i64>,
    error: Option<String>,
}

impl TableJson {
    fn of(table: &'static str, stats: Result<Stats, PublishError>) -> Self {
        match stats {
            Ok(stats) => Self {
                table,
                due: Some(stats.due.into()),
                scheduled: Some(stats.scheduled.into()),
                in_work: stats.in_work.map(Into::into),
                failed: stats.failed.map(Into::into),
                processed: stats.processed.map(Into::into),
                oldest_due_age_ms: stats.oldest_due_age().map(duration_ms),
                at_ms: Some(stats.at.micros() / 1000),
                error: None,
            },
            Err(error) => Self {
                table,
                due: None,
                scheduled: None,
                in_work: None,
                failed: None,
                processed: None,
                oldest_due_age_ms: None,
                at_ms: None,
                error: Some(error.to_string()),
            },
        }
    }
}

/// A failed row as the API answers it.
#[derive(Serialize)]
struct FailedJson {
    id: serde_json::Value,
    attempt: Option<i64>,
    error: Option<String>,
    failed_at_ms: Option<i64>,
    /// The payload as text, invalid UTF-8 replaced.
    payload: Option<String>,
    payload_bytes: Option<usize>,
    /// The row's last errors, oldest first, where the table keeps a history of them.
    errors: Vec<AttemptErrorJson>,
}

/// One failed attempt of a row's history of errors.
#[derive(Serialize)]
struct AttemptErrorJson {
    attempt: Option<i64>,
    at_ms: Option<i64>,
    error: String,
}

impl From<FailedRow> for FailedJson {
    fn from(row: FailedRow) -> Self {
        Self {
            id: value_json(&row.id),
            attempt: row.attempt,
            error: row.error,
            failed_at_ms: row.failed_at.map(|t| t.micros() / 1000),
            payload_bytes: row.payload.as_ref().map(Vec::len),
            errors: row
                .errors
                .into_iter()
                .map(|e| AttemptErrorJson {
                    attempt: e.attempt,
                    at_ms: e.at.map(|t| t.micros() / 1000),
                    error: e.error,
                })
                .collect(),
            payload: row
                .payload
                .map(|p| String::from_utf8_lossy(&p).into_owned()),
        }
    }
}

/// A value as JSON: a number, text, a boolean or null; bytes as their text.
fn value_json(value: &Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(n) => (*n).into(),
        Value::Text(s) => s.clone().into(),
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned().into(),
    }
}

/// An id as a URL gives it: an integer where it parses as one, else text.
fn parse_id(id: &str) -> Value {
    match id.parse::<i64>() {
        Ok(n) => Value::Int(n),
        Err(_) => Value::Text(id.to_owned()),
    }
}

fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Escapes text for an HTML attribute or element.
fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The path the dashboard is mounted under, ending with `/`: the request's original path
/// less the path within the dashboard's router.
fn base_path(original: &Uri, inner: &Uri) -> String {
    let original = original.path();
    let prefix = original
        .strip_suffix(inner.path())
        .unwrap_or(original)
        .trim_end_matches('/');
    format!("{prefix}/")
}

async fn page(
    State(shared): State<Arc<Shared>>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
) -> Response {
    shared.start_sampling();
    let config = json!({
        "writable": shared.token.is_some(),
        "refresh_ms": duration_ms(shared.sample_every).max(1000),
        "tables": shared.tables.iter().map(|t| t.name).collect::<Vec<_>>(),
    });
    let html = PAGE
        .replace("{{TITLE}}", &escape_html(&shared.title))
        .replace("{{BASE}}", &escape_html(&base_path(&original, &uri)))
        .replace("{{CONFIG}}", &escape_html(&config.to_string()));
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        html,
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

async fn tables(State(shared): State<Arc<Shared>>) -> Response {
    shared.start_sampling();
    let mut out = Vec::with_capacity(shared.tables.len());
    for table in &shared.tables {
        out.push(TableJson::of(table.name, table.source.stats().await));
    }
    no_store(Json(json!({ "tables": out })).into_response())
}

async fn history(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    shared.start_sampling();
    let table = shared.table(&name)?;
    let samples: Vec<Sample> = table
        .history
        .lock()
        .expect("the history's lock is never poisoned")
        .samples();
    Ok(no_store(
        Json(json!({
            "table": table.name,
            "interval_ms": duration_ms(shared.sample_every),
            "samples": samples,
        }))
        .into_response(),
    ))
}

/// The query of a page of failed rows.
#[derive(Deserialize)]
struct FailedQuery {
    limit: Option<u32>,
    after: Option<String>,
}

async fn failed(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(query): Query<FailedQuery>,
) -> Result<Response, ApiError> {
    let table = shared.table(&name)?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let after = query
        .after
        .as_deref()
        .filter(|a| !a.is_empty())
        .map(parse_id);
    let rows = table.source.failed(limit, after).await?;
    let next_after = (rows.len() == limit as usize)
        .then(|| rows.last().map(|r| value_json(&r.id)))
        .flatten();
    let rows: Vec<FailedJson> = rows.into_iter().map(Into::into).collect();
    Ok(no_store(
        Json(json!({
            "table": table.name,
            "rows": rows,
            "next_after": next_after,
        }))
        .into_response(),
    ))
}

async fn redrive(
    State(shared): State<Arc<Shared>>,
    Path((name, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    change(&shared, &name, &id, &headers, true).await
}

async fn delete(
    State(shared): State<Arc<Shared>>,
    Path((name, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    change(&shared, &name, &id, &headers, false).await
}

/// Redrives or deletes one failed row, once the request has shown the token.
async fn change(
    shared: &Shared,
    name: &str,
    id: &str,
    headers: &HeaderMap,
    redrive: bool,
) -> Result<Response, ApiError> {
    auth::check(shared.token.as_ref(), headers)?;
    let table = shared.table(name)?;
    let id = parse_id(id);
    let changed = if redrive {
        table.source.redrive(id.clone()).await?
    } else {
        table.source.delete(id.clone()).await?
    };
    if changed == 0 {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "table `{}` has no failed row of id {}",
                table.name,
                value_json(&id)
            ),
        ));
    }
    let mut body = BTreeMap::new();
    body.insert("table", json!(table.name));
    body.insert("id", value_json(&id));
    body.insert(if redrive { "redriven" } else { "deleted" }, json!(changed));
    Ok(no_store(Json(body).into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_as_integers_or_text() {
        assert_eq!(parse_id("42"), Value::Int(42));
        assert_eq!(parse_id("-7"), Value::Int(-7));
        assert_eq!(parse_id("a-b"), Value::Text("a-b".into()));
        assert_eq!(
            parse_id("9999999999999999999999"),
            Value::Text("9999999999999999999999".into())
        );
    }

    #[test]
    fn the_base_path_is_the_mount_point() {
        let u = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(base_path(&u("/"), &u("/")), "/");
        assert_eq!(base_path(&u("/ops"), &u("/")), "/ops/");
        assert_eq!(base_path(&u("/ops/"), &u("/")), "/ops/");
        assert_eq!(base_path(&u("/a/b/"), &u("/")), "/a/b/");
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(
            escape_html(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
