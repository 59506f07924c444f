//! The axum example runs as a process of its own against the test server
//! (`RUSTSTREAM_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`): each signup it
//! accepts is welcomed once, a signup the database refuses is answered 422 and welcomed never,
//! and one SIGTERM stops the web server and the jobs together, with success.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `POST /signups` with `email`; the response's status code.
fn sign_up(addr: &str, email: &str) -> u16 {
    let body = format!("{{\"email\": \"{email}\"}}");
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST /signups HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a response");
    let status = response.split_whitespace().nth(1).expect("a status line");
    status.parse().expect("a status code")
}

#[test]
fn signups_are_welcomed_once_and_sigterm_stops_the_web_server_and_the_jobs() {
    let url = std::env::var("RUSTSTREAM_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let mut child = Command::new(common::example("axum_service"))
        .args([url.as_str(), "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let lines = common::lines(&mut child);
    let next_line = |within: Duration| lines.recv_timeout(within).ok();
    let first = next_line(Duration::from_secs(60)).expect("the example says where it listens");
    let addr = first
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_owned();

    // Addresses of this run only, so the shared table's older rows do not count.
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros()
    );
    let emails: Vec<String> = (0..5)
        .map(|i| format!("user{i}-{run}@example.com"))
        .collect();
    for email in &emails {
        assert_eq!(sign_up(&addr, email), 201, "{email}");
    }
    // Refused by the database: taken, and malformed. Neither writes a job.
    assert_eq!(sign_up(&addr, &emails[0]), 422, "a taken address");
    assert_eq!(sign_up(&addr, &format!("nobody-{run}")), 422, "no @");

    let mut welcomed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while welcomed.len() < emails.len() {
        assert!(Instant::now() < deadline, "welcomed only {welcomed:?}");
        if let Some(line) = next_line(Duration::from_secs(1))
            && let Some(email) = line.strip_prefix("welcomed ")
        {
            welcomed.push(email.to_owned());
        }
    }
    welcomed.sort();
    assert_eq!(welcomed, emails, "each signup welcomed once");

    let status = common::terminate(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(
        rest.iter().all(|l| !l.starts_with("welcomed ")),
        "no second welcome: {rest:?}"
    );
    assert!(
        rest.iter().any(|l| l == "stopped; 5 welcome(s) sent"),
        "{rest:?}"
    );
    // The web server is gone with it.
    assert!(TcpStream::connect(&addr).is_err(), "{addr} still accepts");
}
