//! The dashboard end to end in headless Chromium (Debian's `chromium` package, found on the
//! `PATH`; the test fails, never skips, where it is missing): the rendered page shows the
//! table, its counts, the chart and the failed rows; a screenshot of it is checked pixel by
//! pixel; and, driven over the DevTools protocol, the page's redrive and delete buttons change
//! the rows only once the right token is typed in.

mod common;

use std::future::IntoFuture;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ruststream_web::Dashboard;
use serde_json::{Value as Json, json};
use tokio::process::{Child, Command};

use common::*;

const TOKEN: &str = "browser-t0ken";
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;

/// Chromium on the `PATH`.
fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "`chromium` is not on the PATH: the dashboard's browser test needs headless Chromium \
         (on Debian: `apt-get update && apt-get install -y chromium`)"
    );
}

/// A fresh profile directory for one Chromium run.
fn profile(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("web-chromium-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a profile directory");
    dir
}

fn chromium_command(profile: &Path) -> Command {
    let mut command = Command::new(chromium());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--window-size={WIDTH},{HEIGHT}"))
        .arg(format!("--user-data-dir={}", profile.display()))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs Chromium on `url` with these arguments and answers its standard output.
async fn chromium_once(name: &str, args: &[&str], url: &str) -> String {
    let dir = profile(name);
    let mut command = chromium_command(&dir);
    command
        .arg("--virtual-time-budget=5000")
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::time::timeout(Duration::from_secs(40), command.output())
        .await
        .unwrap_or_else(|_| panic!("chromium {args:?} {url} did not finish in 40 s"))
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "chromium {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the DOM is UTF-8")
}

/// Serves the dashboard on a free port of 127.0.0.1 and answers its URL.
async fn serve(dashboard: Dashboard) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(dashboard.serve_on(listener).into_future());
    format!("http://{addr}/")
}

/// A DevTools protocol session on one page of a Chromium started with a debugging port.
struct Cdp {
    browser: Child,
    profile: PathBuf,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Cdp {
    async fn open(url: &str) -> Cdp {
        let profile = profile("cdp");
        let mut command = chromium_command(&profile);
        command
            .arg("--remote-debugging-port=0")
            .arg("--remote-debugging-address=127.0.0.1")
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let browser = command.spawn().expect("chromium starts");
        // Chromium writes the port it chose into the profile.
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port: u16 = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "chromium wrote no DevToolsActivePort in 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let debugger = SocketAddr::from(([127, 0, 0, 1], port));
        let ws_url = loop {
            let pages = http_get_json(debugger, "/json/list");
            let found = pages.as_array().and_then(|pages| {
                pages
                    .iter()
                    .find(|p| p["type"] == "page" && p["url"].as_str() == Some(url))
                    .and_then(|p| p["webSocketDebuggerUrl"].as_str().map(str::to_owned))
            });
            if let Some(ws) = found {
                break ws;
            }
            assert!(
                Instant::now() < deadline,
                "chromium lists no page of {url}: {pages}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (socket, _) = tokio::task::block_in_place(|| tungstenite::connect(&ws_url))
            .unwrap_or_else(|e| panic!("the DevTools socket {ws_url}: {e}"));
        if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
        }
        Cdp {
            browser,
            profile,
            socket,
            next_id: 1,
        }
    }

    /// Evaluates `expression` in the page, awaiting a promise, and answers its value.
    fn eval(&mut self, expression: &str) -> Json {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({
            "id": id,
            "method": "Runtime.evaluate",
            "params": {"expression": expression, "awaitPromise": true, "returnByValue": true},
        });
        tokio::task::block_in_place(|| {
            self.socket
                .send(tungstenite::Message::Text(request.to_string().into()))
                .expect("send to DevTools");
            loop {
                let message = self.socket.read().expect("read from DevTools");
                let tungstenite::Message::Text(text) = message else {
                    continue;
                };
                let answer: Json = serde_json::from_str(&text).expect("DevTools answers JSON");
                if answer["id"] != id {
                    continue;
                }
                let result = &answer["result"];
                assert!(
                    result.get("exceptionDetails").is_none() && answer.get("error").is_none(),
                    "{expression}: {answer}"
                );
                return result["result"]["value"].clone();
            }
        })
    }

    /// Waits until `expression` is true in the page.
    async fn until(&mut self, what: &str, expression: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.eval(expression) == Json::Bool(true) {
                return;
            }
            let status = self.eval("(document.getElementById('status') || {}).textContent || ''");
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the status reads {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn close(mut self) {
        let _ = self.socket.close(None);
        let _ = self.browser.kill().await;
        // Chromium's helper processes may still write into the profile for a moment.
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self.profile).is_ok() || !self.profile.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A GET of JSON over plain HTTP/1.1, read up to its `Content-Length`.
fn http_get_json(addr: SocketAddr, path: &str) -> Json {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return Json::Null;
    };
    if stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .is_err()
        || write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .is_err()
    {
        return Json::Null;
    }
    let mut response = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&response[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            if let Some(length) = length
                && response.len() >= end + 4 + length
            {
                return serde_json::from_slice(&response[end + 4..end + 4 + length])
                    .unwrap_or(Json::Null);
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
        }
    }
    let body = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(&[][..], |end| &response[end + 4..]);
    serde_json::from_slice(body).unwrap_or(Json::Null)
}

/// The decoded RGBA pixels of a PNG, with its size.
fn decode_png(path: &Path) -> (u32, u32, Vec<[u8; 4]>) {
    let file = std::fs::File::open(path).expect("the screenshot exists");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let bytes = &buf[..info.buffer_size()];
    let pixels = match info.color_type {
        png::ColorType::Rgba => bytes
            .chunks_exact(4)
            .map(|p| [p[0], p[1], p[2], p[3]])
            .collect(),
        png::ColorType::Rgb => bytes
            .chunks_exact(3)
            .map(|p| [p[0], p[1], p[2], 255])
            .collect(),
        other => panic!("a screenshot of colour type {other:?}"),
    };
    (info.width, info.height, pixels)
}

fn near(p: [u8; 4], rgb: [u8; 3], tolerance: i32) -> bool {
    (0..3).all(|i| (i32::from(p[i]) - i32::from(rgb[i])).abs() <= tolerance)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_headless_chromium() {
    // Fails at once, naming the package, where Chromium is missing.
    chromium();
    let pg = Pg::new("browser").await;
    let running = started(&pg).await;
    let url = serve(
        Dashboard::new()
            .table::<WebJob, _>(running.handle().clone())
            .token(TOKEN)
            .title("shop")
            .sample_every(Duration::from_millis(200)),
    )
    .await;
    let read_only = serve(
        Dashboard::new()
            .table::<WebJob, _>(running.handle().clone())
            .sample_every(Duration::from_millis(200)),
    )
    .await;
    // A few samples for the chart.
    tokio::time::sleep(Duration::from_millis(900)).await;

    // The rendered page: the table, its counts, the chart, the failed rows and their buttons.
    let dom = chromium_once("dom", &["--dump-dom"], &url).await;
    for expected in [
        r#"data-loaded="true""#,
        r#"<section class="table" data-table="web_jobs">"#,
        r#"<h2>web_jobs</h2>"#,
        r#"<dd data-count="due" data-value="5">5</dd>"#,
        r#"<dd data-count="scheduled" data-value="1">1</dd>"#,
        r#"<dd data-count="in_work" data-value="0">0</dd>"#,
        r#"<dd data-count="failed" data-value="2">2</dd>"#,
        r#"<td class="error">boom 6</td>"#,
        r#"<td class="error">boom 8<details class="errors"><summary>2 errors</summary><ol><li>attempt 1 ("#,
        r#"): boom earlier</li><li>attempt 2 ("#,
        r#"): boom 8</li></ol></details></td>"#,
        r#"<tr data-id="6">"#,
        r#"<td class="attempt">0</td>"#,
        r#"<pre>{"n":5}</pre>"#,
        r#"<button class="redrive" type="button">redrive</button>"#,
        r#"<button class="delete" type="button">delete</button>"#,
        "<polyline",
        r#"data-series="due""#,
        r#"data-series="failed_per_s""#,
        "<title>shop · queues</title>",
    ] {
        assert!(
            dom.contains(expected),
            "the page does not show `{expected}`:\n{dom}"
        );
    }
    assert!(!dom.contains("Loading…"), "{dom}");
    assert!(!dom.contains(TOKEN));

    // The read-only dashboard shows the rows without buttons.
    let dom = chromium_once("readonly", &["--dump-dom"], &read_only).await;
    assert!(dom.contains(r#"<td class="error">boom 6</td>"#), "{dom}");
    assert!(
        dom.contains(r#"<div id="readonly" class="badge">read-only</div>"#),
        "{dom}"
    );
    assert!(!dom.contains(r#"class="redrive""#), "{dom}");
    assert!(!dom.contains(r#"class="delete""#), "{dom}");

    // A screenshot of the right size, with the chart drawn.
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("web-dashboard-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&shot);
    chromium_once("shot", &[&format!("--screenshot={}", shot.display())], &url).await;
    let (width, height, pixels) = decode_png(&shot);
    assert_eq!((width, height), (WIDTH, HEIGHT), "{}", shot.display());
    let mut colours: Vec<[u8; 4]> = pixels.clone();
    colours.sort_unstable();
    colours.dedup();
    assert!(
        colours.len() > 64,
        "a blank screenshot: {} colours in {}",
        colours.len(),
        shot.display()
    );
    // The due line (#2563eb) and the failed line (#dc2626) of the chart, beyond their legend
    // swatches and their counts' digits.
    let blue = pixels
        .iter()
        .filter(|p| near(**p, [0x25, 0x63, 0xeb], 40))
        .count();
    let red = pixels
        .iter()
        .filter(|p| near(**p, [0xdc, 0x26, 0x26], 40))
        .count();
    assert!(
        blue > 800,
        "{blue} pixels of the due line in {}",
        shot.display()
    );
    assert!(
        red > 800,
        "{red} pixels of the failed line in {}",
        shot.display()
    );
    // The header's dark band across the top.
    let dark = pixels[..(WIDTH * 20) as usize]
        .iter()
        .filter(|p| near(**p, [0x1d, 0x23, 0x30], 8))
        .count();
    assert!(
        dark > (WIDTH * 10) as usize,
        "no header in {}",
        shot.display()
    );
    println!("screenshot: {}", shot.display());

    // The buttons, clicked in a live page: a wrong token is refused and changes nothing; the
    // right one redrives row 6 and deletes row 8.
    let mut page = Cdp::open(&url).await;
    page.until(
        "the failed rows",
        r#"document.querySelector('section[data-table="web_jobs"] tr[data-id="6"] button.redrive') !== null"#,
    )
    .await;
    let click = |id: i64, action: &str, token: &str| {
        format!(
            r#"(() => {{
                document.getElementById('token').value = {token};
                document.querySelector('section[data-table="web_jobs"] tr[data-id="{id}"] button.{action}').click();
                return true;
            }})()"#,
            token = json!(token)
        )
    };
    let status_has = |text: &str| {
        format!(
            "document.getElementById('status').textContent.includes({})",
            json!(text)
        )
    };
    assert_eq!(page.eval(&click(6, "redrive", "")), Json::Bool(true));
    page.until("a refusal without a token", &status_has("refused (401)"))
        .await;
    assert!(pg.is_failed(6).await, "no token changed the row");
    assert_eq!(page.eval(&click(6, "redrive", "wrong")), Json::Bool(true));
    page.until("a refusal of a wrong token", &status_has("refused (403)"))
        .await;
    assert!(pg.is_failed(6).await, "a wrong token changed the row");
    assert_eq!(page.eval(&click(8, "delete", "wrong")), Json::Bool(true));
    page.until(
        "a refusal of a wrong token",
        &status_has("delete of row 8 refused (403)"),
    )
    .await;
    assert!(pg.exists(8).await, "a wrong token deleted the row");

    assert_eq!(page.eval(&click(6, "redrive", TOKEN)), Json::Bool(true));
    page.until("the redrive", &status_has("web_jobs: row 6 redriven"))
        .await;
    assert!(!pg.is_failed(6).await, "row 6 is redriven");
    assert!(pg.exists(6).await);
    page.until(
        "row 6 gone from the failed rows",
        r#"document.querySelector('tr[data-id="6"]') === null"#,
    )
    .await;
    assert_eq!(page.eval(&click(8, "delete", TOKEN)), Json::Bool(true));
    page.until("the delete", &status_has("web_jobs: row 8 deleted"))
        .await;
    assert!(!pg.exists(8).await, "row 8 is deleted");
    page.until(
        "the counts after the changes",
        r#"document.querySelector('dd[data-count="due"]').textContent === '6'
            && document.querySelector('dd[data-count="failed"]').textContent === '0'"#,
    )
    .await;
    page.close().await;

    running.shutdown().await;
    pg.drop().await;
}
