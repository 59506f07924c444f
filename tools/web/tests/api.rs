//! The dashboard's HTTP API apart, on its router, against a PostgreSQL table: the counts and
//! their history, the failed rows page by page, and redrive and delete, which change a row
//! only for a request that carries the dashboard's token.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use ruststream_web::Dashboard;
use serde_json::Value as Json;
use tower::ServiceExt;

use common::*;

const TOKEN: &str = "t0ken-of-the-test";

async fn call(router: &Router, method: &str, uri: &str, auth: Option<&str>) -> (StatusCode, Json) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(auth) = auth {
        request = request.header(header::AUTHORIZATION, auth);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Json::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, json)
}

async fn get(router: &Router, uri: &str) -> (StatusCode, Json) {
    call(router, "GET", uri, None).await
}

fn ids(page: &Json) -> Vec<i64> {
    page["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["id"].as_i64().expect("an integer id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reads_the_table_and_changes_rows_only_with_the_token() {
    let pg = Pg::new("api").await;
    let running = started(&pg).await;
    let dashboard = Dashboard::new()
        .table::<WebJob, _>(running.handle().clone())
        .token(TOKEN)
        .sample_every(Duration::from_millis(100));
    let router = dashboard.router();

    // The counts.
    let (status, body) = get(&router, "/api/tables").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tables = body["tables"].as_array().expect("tables");
    assert_eq!(tables.len(), 1, "{body}");
    let t = &tables[0];
    assert_eq!(t["table"], TABLE);
    assert_eq!(t["error"], Json::Null, "{body}");
    assert_eq!(t["due"]["value"], 5, "{body}");
    assert_eq!(t["due"]["exact"], true);
    assert_eq!(t["due"]["text"], "5");
    assert_eq!(t["scheduled"]["value"], 1, "{body}");
    assert_eq!(t["in_work"]["value"], 0, "{body}");
    assert_eq!(t["failed"]["value"], 2, "{body}");
    assert_eq!(t["processed"], Json::Null);
    let age = t["oldest_due_age_ms"].as_u64().expect("rows are due");
    assert!(age < 60_000, "{age}");
    // The same counts the broker reads.
    let stats = running.stats::<WebJob>().await.expect("the counts");
    assert_eq!(t["due"]["value"], stats.due.value());
    assert_eq!(t["failed"]["value"], stats.failed.unwrap().value());

    // The history fills from the sampler.
    eventually("two samples", || async {
        let (_, h) = get(&router, "/api/tables/web_jobs/history").await;
        h["samples"].as_array().is_some_and(|s| s.len() >= 2)
    })
    .await;
    let (status, history) = get(&router, "/api/tables/web_jobs/history").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(history["table"], TABLE);
    assert_eq!(history["interval_ms"], 100);
    let sample = &history["samples"][0];
    assert_eq!(
        (&sample["due"], &sample["scheduled"], &sample["failed"]),
        (&Json::from(5), &Json::from(1), &Json::from(2)),
        "{history}"
    );
    assert!(sample["at_ms"].as_i64().unwrap() > 1_600_000_000_000);
    assert_eq!(
        get(&router, "/api/tables/nope/history").await.0,
        StatusCode::NOT_FOUND
    );

    // The failed rows, with their error, attempt and payload, page by page.
    let (status, page) = get(&router, "/api/tables/web_jobs/failed").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(ids(&page), [6, 8]);
    assert_eq!(page["rows"][0]["error"], "boom 6");
    assert_eq!(page["rows"][0]["attempt"], 0);
    assert_eq!(page["rows"][0]["payload"], r#"{"n":5}"#);
    assert_eq!(page["rows"][0]["payload_bytes"], 7);
    assert!(page["rows"][0]["failed_at_ms"].as_i64().is_some());
    assert_eq!(page["rows"][0]["errors"], serde_json::json!([]), "{page}");
    assert_eq!(
        page["rows"][1]["errors"],
        serde_json::json!([
            {"attempt": 1, "at_ms": 1_765_000_000_000_i64, "error": "boom earlier"},
            {"attempt": 2, "at_ms": 1_765_000_001_000_i64, "error": "boom 8"},
        ]),
        "{page}: row 8's history of errors, oldest first"
    );
    assert_eq!(page["next_after"], Json::Null);
    let (_, first) = get(&router, "/api/tables/web_jobs/failed?limit=1").await;
    assert_eq!(ids(&first), [6]);
    assert_eq!(first["next_after"], 6);
    let (_, next) = get(&router, "/api/tables/web_jobs/failed?limit=1&after=6").await;
    assert_eq!(ids(&next), [8]);
    assert_eq!(
        get(&router, "/api/tables/nope/failed").await.0,
        StatusCode::NOT_FOUND
    );

    // No token, another scheme, a wrong token: refused, and the row stays failed.
    let redrive6 = "/api/tables/web_jobs/failed/6/redrive";
    let (status, body) = call(&router, "POST", redrive6, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(pg.is_failed(6).await, "no token changed the row");
    let (status, _) = call(&router, "POST", redrive6, Some(&format!("Basic {TOKEN}"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(pg.is_failed(6).await);
    let (status, body) = call(&router, "POST", redrive6, Some("Bearer wrong")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(pg.is_failed(6).await, "a wrong token changed the row");
    let (status, _) = call(&router, "POST", redrive6, Some(&format!("Bearer {TOKEN}x"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(
        &router,
        "POST",
        "/api/tables/web_jobs/failed/8/delete",
        Some("Bearer wrong"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(pg.exists(8).await, "a wrong token deleted the row");
    // A GET does not reach the mutation.
    assert_eq!(
        get(&router, redrive6).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert!(pg.is_failed(6).await);

    // The right token redrives row 6 and deletes row 8.
    let (status, body) = call(&router, "POST", redrive6, Some(&format!("Bearer {TOKEN}"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["redriven"], 1);
    assert_eq!(body["id"], 6);
    assert!(!pg.is_failed(6).await, "row 6 is redriven");
    assert!(pg.exists(6).await);
    assert_eq!(
        pg.scalar(
            "SELECT COUNT(*) FROM web_jobs WHERE id = 6 AND error IS NULL AND due_at <= now()"
        )
        .await,
        1,
        "row 6 is due now, its error cleared"
    );
    let (status, body) = call(
        &router,
        "POST",
        "/api/tables/web_jobs/failed/8/delete",
        Some(&format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["deleted"], 1);
    assert!(!pg.exists(8).await, "row 8 is deleted");
    // A row that is not failed, an id of text, a table not registered: nothing to change.
    let (status, body) = call(&router, "POST", redrive6, Some(&format!("Bearer {TOKEN}"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = call(
        &router,
        "POST",
        "/api/tables/nope/failed/1/redrive",
        Some(&format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = get(&router, "/api/tables").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tables"][0]["due"]["value"], 6, "{body}");
    assert_eq!(body["tables"][0]["failed"]["value"], 0, "{body}");

    // The page: buttons shown for a dashboard with a token.
    let (status, page) = get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    let page = page.as_str().expect("html").to_owned();
    assert!(page.contains("&quot;writable&quot;:true"), "{page}");
    assert!(!page.contains(TOKEN), "the page never holds the token");

    running.shutdown().await;
    drop(router);
    pg.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_without_a_token_is_read_only() {
    let pg = Pg::new("readonly").await;
    let running = started(&pg).await;
    let router = Dashboard::new()
        .table::<WebJob, _>(running.handle().clone())
        .router();

    let (status, body) = get(&router, "/api/tables/web_jobs/failed").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&body), [6, 8]);
    for auth in [
        None,
        Some("Bearer "),
        Some("Bearer anything"),
        Some("Bearer t0ken-of-the-test"),
    ] {
        for action in ["redrive", "delete"] {
            let uri = format!("/api/tables/web_jobs/failed/6/{action}");
            let (status, body) = call(&router, "POST", &uri, auth).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{auth:?} {action}: {body}");
            assert!(
                body["error"].as_str().unwrap().contains("read-only"),
                "{body}"
            );
        }
    }
    assert!(
        pg.is_failed(6).await,
        "the read-only dashboard changed a row"
    );
    assert!(pg.exists(6).await);
    let (_, page) = get(&router, "/").await;
    assert!(
        page.as_str()
            .unwrap()
            .contains("&quot;writable&quot;:false")
    );

    running.shutdown().await;
    pg.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_mounts_under_a_path() {
    let pg = Pg::new("mount").await;
    let running = started(&pg).await;
    let dashboard = Dashboard::new().table::<WebJob, _>(running.handle().clone());
    let app = Router::new().nest("/ops/queues", dashboard.router());

    let (status, page) = get(&app, "/ops/queues").await;
    assert_eq!(status, StatusCode::OK);
    let page = page.as_str().unwrap();
    assert!(page.contains(r#"src="/ops/queues/dashboard.js""#), "{page}");
    let (status, body) = get(&app, "/ops/queues/api/tables").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tables"][0]["table"], TABLE);
    let (status, script) = get(&app, "/ops/queues/dashboard.js").await;
    assert_eq!(status, StatusCode::OK);
    assert!(script.as_str().unwrap().contains("use strict"));

    running.shutdown().await;
    pg.drop().await;
}
