use std::sync::atomic::AtomicBool;
use std::task::{Wake, Waker};

use futures::executor::block_on;
use ruststream_core::{Output, StatementKind};

use super::*;

/// A blocking driver of pretend connections that records what runs on them, on which
/// thread.
#[derive(Default)]
struct Pretend {
    log: Mutex<Vec<String>>,
    /// Set: the next open fails.
    refuse: AtomicBool,
}

struct PretendConn {
    n: usize,
    in_transaction: bool,
}

impl Pretend {
    fn note(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl BlockingDriver for Pretend {
    const CLAIM: &'static str = "PretendClaim";
    type Connection = PretendConn;
    type Row = String;
    type Lock = bool;
    type Interrupt = Arc<AtomicBool>;

    fn open(&self, first: bool) -> Result<(PretendConn, Arc<AtomicBool>), DbError> {
        if self.refuse.swap(false, Ordering::SeqCst) {
            return Err(DbError::new(ErrorKind::ConnectionLost, "refused"));
        }
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        self.note(format!("open first={first}"));
        Ok((
            PretendConn {
                n,
                in_transaction: false,
            },
            Arc::new(AtomicBool::new(false)),
        ))
    }

    fn interrupt(&self, interrupt: &Arc<AtomicBool>) {
        interrupt.store(true, Ordering::SeqCst);
    }

    fn execute(&self, conn: &mut PretendConn, statement: &Statement, _: &[Value]) -> Reply<String> {
        let thread = std::thread::current().name().unwrap_or("").to_owned();
        match &*statement.sql {
            "BEGIN" => conn.in_transaction = true,
            "PANIC" => panic!("a statement that panics"),
            "SLEEP" => std::thread::sleep(Duration::from_millis(200)),
            _ => {}
        }
        Reply::Rows(vec![ruststream_core::Row {
            values: vec![Value::Int(conn.n as i64)],
            raw: Some(thread),
            unread: None,
        }])
    }

    fn lock(
        &self,
        _: &mut PretendConn,
        lock: &bool,
        key: &str,
        take: bool,
    ) -> Result<bool, DbError> {
        if key == "panic" {
            panic!("a lock that panics");
        }
        Ok(*lock && take)
    }

    fn reset(&self, conn: &mut PretendConn) {
        if conn.in_transaction {
            self.note(format!("rollback {}", conn.n));
            conn.in_transaction = false;
        }
    }

    fn close(&self, conn: PretendConn) {
        self.note(format!("close {}", conn.n));
    }
}

fn pool(max: usize, acquire_timeout: Duration) -> Threads<Pretend> {
    Threads::new(
        Pretend::default(),
        ThreadSettings {
            max_connections: max,
            acquire_timeout,
            look_for_answer: Duration::ZERO,
            thread_name: "pretend-conn".into(),
        },
    )
}

fn statement(sql: &str) -> Statement {
    Statement {
        kind: StatementKind::ListColumns,
        sql: sql.into(),
        args: Arc::from([]),
        output: Output::Nothing,
    }
}

/// The connection's number and the thread that ran the statement.
fn run(threads: &Threads<Pretend>, conn: &mut ThreadConn<Pretend>, sql: &str) -> Reply<String> {
    block_on(threads.execute(conn, statement(sql), Vec::new(), false))
}

fn served_by(reply: Reply<String>) -> (i64, String) {
    match reply {
        Reply::Rows(mut rows) => {
            let row = rows.remove(0);
            let Value::Int(n) = row.values[0] else {
                panic!("a number")
            };
            (n, row.raw.expect("the thread"))
        }
        other => panic!("rows, not {other:?}"),
    }
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let since = Instant::now();
    while !done() {
        assert!(since.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn statements_run_on_the_connections_own_thread() {
    let threads = pool(2, Duration::from_secs(5));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    let (n, thread) = served_by(run(&threads, &mut conn, "SELECT"));
    assert_eq!(thread, "pretend-conn");
    let (again, _) = served_by(run(&threads, &mut conn, "SELECT"));
    assert_eq!(n, again, "one connection per handle");
    assert_eq!(threads.open_connections(), 1);
    assert_eq!(threads.driver().log(), ["open first=true"]);
}

#[test]
fn a_released_connection_is_reset_and_lent_again() {
    let threads = pool(2, Duration::from_secs(5));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    let (n, _) = served_by(run(&threads, &mut conn, "BEGIN"));
    block_on(threads.release(conn));
    assert_eq!(
        threads.driver().log().last().unwrap(),
        &format!("rollback {n}")
    );
    let mut again = block_on(threads.acquire()).expect("a connection");
    assert_eq!(served_by(run(&threads, &mut again, "SELECT")).0, n);
    assert_eq!(threads.open_connections(), 1, "no second connection opened");
}

#[test]
fn an_acquire_past_the_most_waits_for_one_to_come_back() {
    let threads = pool(1, Duration::from_secs(10));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    let (n, _) = served_by(run(&threads, &mut conn, "SELECT"));
    let waiting = {
        let threads = threads.clone();
        std::thread::spawn(move || block_on(threads.acquire()))
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!waiting.is_finished(), "the one connection is lent");
    block_on(threads.release(conn));
    let mut handed = waiting.join().unwrap().expect("the connection given back");
    assert_eq!(served_by(run(&threads, &mut handed, "SELECT")).0, n);
    assert_eq!(threads.open_connections(), 1);
}

#[test]
fn an_acquire_past_the_most_fails_after_its_timeout_and_names_it() {
    let threads = pool(1, Duration::from_millis(100));
    let _held = block_on(threads.acquire()).expect("a connection");
    let since = Instant::now();
    let error = block_on(threads.acquire()).expect_err("none comes back");
    assert!(since.elapsed() >= Duration::from_millis(100));
    assert_eq!(error.kind, ErrorKind::PoolClosed);
    assert!(error.message.contains("100ms"), "{}", error.message);
}

#[test]
fn a_closed_connection_frees_its_place_for_an_acquire_waiting() {
    let threads = pool(1, Duration::from_secs(10));
    let conn = block_on(threads.acquire()).expect("a connection");
    let waiting = {
        let threads = threads.clone();
        std::thread::spawn(move || block_on(threads.acquire()))
    };
    std::thread::sleep(Duration::from_millis(50));
    block_on(threads.close(
        conn,
        Ending::Clean {
            in_transaction: false,
        },
    ));
    let mut fresh = waiting.join().unwrap().expect("a new connection");
    run(&threads, &mut fresh, "SELECT");
    assert_eq!(threads.open_connections(), 1);
    let log = threads.driver().log();
    assert_eq!(log[0], "open first=true");
    assert!(log[1].starts_with("close "), "{log:?}");
    assert_eq!(log[2], "open first=false");
}

#[test]
fn a_connection_that_fails_to_open_fails_its_acquire_and_frees_its_place() {
    let threads = pool(1, Duration::from_secs(5));
    threads.driver().refuse.store(true, Ordering::SeqCst);
    let error = block_on(threads.acquire()).expect_err("refused");
    assert_eq!(error.kind, ErrorKind::ConnectionLost);
    assert_eq!(error.message, "refused");
    let mut conn = block_on(threads.acquire()).expect("the next opens");
    run(&threads, &mut conn, "SELECT");
}

#[test]
fn a_cut_short_close_interrupts_the_statement_in_flight() {
    let threads = pool(1, Duration::from_secs(5));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    let interrupt = conn.interrupt.clone();
    drop(threads.execute(&mut conn, statement("SLEEP"), Vec::new(), false));
    block_on(threads.close(conn, Ending::CutShort));
    assert!(interrupt.load(Ordering::SeqCst));
    assert_eq!(
        threads.open_connections(),
        0,
        "closed once the close answers"
    );
}

#[test]
fn a_panic_on_the_thread_closes_that_connection_only() {
    let threads = pool(2, Duration::from_secs(5));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    let error = match run(&threads, &mut conn, "PANIC") {
        Reply::Failed(error) => error,
        other => panic!("a failure, not {other:?}"),
    };
    assert_eq!(error.kind, ErrorKind::ConnectionLost);
    wait_until("the thread closes its connection", || {
        threads.open_connections() == 0
    });
    let lock = block_on(threads.lock(&mut conn, &true, "k", true));
    assert_eq!(lock.expect_err("gone").kind, ErrorKind::ConnectionLost);
    let mut other = block_on(threads.acquire()).expect("another");
    run(&threads, &mut other, "SELECT");
}

#[test]
fn a_lock_that_panics_fails_and_keeps_its_connection() {
    let threads = pool(1, Duration::from_secs(5));
    let mut conn = block_on(threads.acquire()).expect("a connection");
    assert!(block_on(threads.lock(&mut conn, &true, "k", true)).expect("taken"));
    let error = block_on(threads.lock(&mut conn, &true, "panic", true)).expect_err("panics");
    assert!(error.message.contains("panicked"), "{}", error.message);
    run(&threads, &mut conn, "SELECT");
}

#[test]
fn the_close_of_the_pool_closes_idle_connections_refuses_acquires_and_closes_lent_ones_on_return() {
    let threads = pool(3, Duration::from_secs(5));
    let idle = block_on(threads.acquire()).expect("a connection");
    let lent = block_on(threads.acquire()).expect("another");
    block_on(threads.release(idle));
    assert_eq!(threads.open_connections(), 2);
    block_on(threads.close_all());
    assert_eq!(threads.open_connections(), 1, "the idle one closed");
    let error = block_on(threads.acquire()).expect_err("closed");
    assert_eq!(error.kind, ErrorKind::PoolClosed);
    block_on(threads.release(lent));
    assert_eq!(threads.open_connections(), 0, "closed as it came back");
}

#[test]
fn a_pool_dropped_ends_its_threads() {
    let threads = pool(2, Duration::from_secs(5));
    let open = threads.shared.open.clone();
    let conn = block_on(threads.acquire()).expect("a connection");
    block_on(threads.release(conn));
    let held = block_on(threads.acquire()).expect("a connection");
    let other = block_on(threads.acquire()).expect("another");
    block_on(threads.release(other));
    drop(held);
    drop(threads);
    wait_until("every thread closes its connection", || {
        open.load(Ordering::SeqCst) == 0
    });
}

#[derive(Default)]
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Woken {
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

/// An answer awaited by a task whose wake-ups are recorded, and the sender that answers it.
struct Probe {
    woken: Arc<Woken>,
    waker: Waker,
    tx: Option<oneshot::Sender<u32>>,
    answer: Answer<u32>,
}

impl Probe {
    fn new(look: Duration) -> Self {
        let woken = Arc::new(Woken::default());
        let (tx, rx) = oneshot::channel();
        Self {
            waker: Waker::from(woken.clone()),
            woken,
            tx: Some(tx),
            answer: Answer::new(rx, look),
        }
    }

    fn poll(&mut self) -> Poll<Result<u32, oneshot::Canceled>> {
        std::pin::Pin::new(&mut self.answer).poll(&mut Context::from_waker(&self.waker))
    }

    fn woken(&self) -> bool {
        self.woken.take()
    }

    fn answer(&mut self, n: u32) {
        let tx = self.tx.take().expect("answered once");
        tx.send(n).expect("the answer is awaited");
    }
}

#[test]
fn while_it_looks_a_poll_without_the_answer_wakes_its_task_again() {
    let mut probe = Probe::new(Duration::from_secs(60));
    assert!(probe.poll().is_pending());
    assert!(probe.woken(), "the task is woken at once, to look again");
    assert!(probe.poll().is_pending());
    assert!(probe.woken());
    probe.answer(7);
    assert_eq!(probe.poll(), Poll::Ready(Ok(7)));
}

#[test]
fn after_the_look_the_task_waits_for_the_connections_thread_to_wake_it() {
    let mut probe = Probe::new(Duration::from_micros(200));
    assert!(probe.poll().is_pending());
    assert!(probe.woken(), "within the look");
    std::thread::sleep(Duration::from_micros(300));
    assert!(probe.poll().is_pending());
    assert!(
        !probe.woken(),
        "past the look, a poll does not wake its task"
    );
    assert!(probe.poll().is_pending());
    assert!(!probe.woken());
    probe.answer(3);
    assert!(probe.woken(), "the answer wakes the task");
    assert_eq!(probe.poll(), Poll::Ready(Ok(3)));
}

#[test]
fn a_zero_look_never_wakes_its_own_task() {
    let mut probe = Probe::new(Duration::ZERO);
    assert!(probe.poll().is_pending());
    assert!(!probe.woken());
    drop(probe.tx.take());
    assert!(
        probe.woken(),
        "a thread that ends without answering wakes the task"
    );
    assert_eq!(probe.poll(), Poll::Ready(Err(oneshot::Canceled)));
}
