//! The adapter's side of the suite: [`Harness`].

use std::future::Future;
use std::pin::Pin;

use futures::future::LocalBoxFuture;
use ruststream::adapter::{Adapter, TakesRows};
use ruststream::{BoxError, BrokerHandle, Context, HandlerOutcome, InboxContext, Published, Stats};
use ruststream_core::Dialect;

use crate::rows::{Body, SuiteRow, Tables};
use crate::support::Cx;
use crate::{Form, NotApplicable};

/// What a harness's own SQL answers.
pub type HarnessResult<T> = Result<T, BoxError>;

/// A future of a harness: sendable, since the scenarios await it inside a running service.
pub type HarnessFuture<'a, T> = Pin<Box<dyn Future<Output = HarnessResult<T>> + Send + 'a>>;

/// What [`Harness::write_in_claim`] answers: the outcome to settle by where the write failed.
pub type ClaimFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerOutcome>> + Send + 'a>>;

/// Whether a harness can do something a scenario needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// It can.
    Yes,
    /// It cannot, for this reason: the scenario answers "not applicable" with it.
    No(&'static str),
}

/// What a harness can do beside running SQL, for the scenarios that need it.
///
/// The forms it runs are not listed here but in its types: every harness runs the lease, the
/// advisory lock and the custom lock forms (its adapter takes the suite's rows, [`Runs`]); the
/// row lock form runs where [`Harness::RowLock`] is [`RowLocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// [`Harness::hold_key`]: holding an advisory key on a connection of the harness's own, as
    /// another process would. SQLite: no, it has no locks a session holds.
    pub hold_key: Support,
    /// [`Harness::kill_key_holder`]: killing, from the server side, the connection that holds
    /// a key. SQLite: no, it has no server.
    pub kill_connection: Support,
    /// Killing a worker process with SIGKILL: the crash test re-runs the test binary as a
    /// child and kills it.
    pub kill_process: Support,
    /// Lending the delivery's transaction to a handler (its claim) in the lease form.
    /// rusqlite: no, it lends one in the advisory lock form only.
    pub claim_in_lease: Support,
}

/// What [`abort_in_transaction`] writes to stderr before the process aborts.
pub const ABORT_MARK: &str = "conformance: aborting with the transaction open";

/// Aborts the process, with a line on stderr that says so: what a harness does for
/// [`TxEnd::Crash`] once the transaction holds its rows.
pub fn abort_in_transaction() -> ! {
    eprintln!("{ABORT_MARK}");
    std::process::abort()
}

/// How [`Harness::publish_in_transaction`] ends its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxEnd {
    /// It commits.
    Commit,
    /// It rolls back.
    Rollback,
    /// The process aborts with it open: a crash between the publish and the commit.
    Crash,
}

/// An advisory key a harness holds on a connection of its own, as another process would.
pub trait HeldKey: Send {
    /// Releases the key (and closes the connection that held it).
    fn release(self: Box<Self>) -> HarnessFuture<'static, ()>;
}

/// The adapter's side of the suite: a database per scenario, a connection of its own for
/// setup and assertions, its dialect and capabilities.
///
/// Each scenario calls [`Harness::prepare`] once, then [`Harness::broker`] for every broker
/// it starts (a crash test, a second broker after a shutdown) and [`Harness::execute`] and
/// [`Harness::query_i64s`] for its own SQL. The scenario creates its tables itself, dropping
/// them first; the harness gives the place.
///
/// A harness runs the scenarios on the suite's rows as its adapter decodes them ([`Runs`]):
/// the rows its tests define with [`suite_rows!`](crate::suite_rows).
pub trait Harness: Send + Sync + Sized + 'static {
    /// The adapter. It takes the suite's rows in the lease, advisory lock and custom lock forms,
    /// and in the row lock form where [`Harness::RowLock`] is [`RowLocks`]: [`Runs`] holds
    /// where it does, for each scenario's tables.
    type Adapter: Adapter;
    /// [`RowLocks`] where the adapter takes the suite's row lock tables, [`NoRowLocks`] where
    /// it does not (SQLite, where a row lock table does not compile).
    type RowLock: RowLockSupport;

    /// The harness's name in messages, such as `rusqlite`.
    fn name(&self) -> &'static str;

    /// The database's dialect: the DDL and the scenario's SQL follow it.
    fn dialect(&self) -> Dialect;

    /// What the harness can do beside running SQL.
    fn capabilities(&self) -> Capabilities;

    /// Whether the harness runs `form`: the lease, advisory lock and custom lock forms always,
    /// the row lock form where [`Harness::RowLock`] is [`RowLocks`].
    fn runs(&self, form: Form) -> Result<(), NotApplicable> {
        match form {
            Form::RowLock => Self::RowLock::applies(self),
            Form::Lease | Form::Advisory | Form::Custom => Ok(()),
        }
    }

    /// Prepares the database of the scenario whose table is `table` and answers its locator:
    /// what [`Harness::broker`], [`Harness::execute`] and [`Harness::query_i64s`] take, and
    /// what a crash test hands its child process, which passes it back unchanged. SQLite: a
    /// new file; a server: the test database, where each scenario's tables have names of their
    /// own.
    fn prepare<'a>(&'a self, table: &'a str) -> HarnessFuture<'a, String>;

    /// A fresh broker on the database `db` names; nothing connects until it starts.
    fn broker(&self, db: &str) -> BrokerHandle<Self::Adapter>;

    /// Runs one SQL statement on a connection of the harness's own.
    fn execute<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, ()>;

    /// Runs one query on a connection of the harness's own and answers the first column of
    /// each row as an integer. A `NULL` is an error: the scenarios wrap nullable columns in
    /// `COALESCE`.
    fn query_i64s<'a>(&'a self, db: &'a str, sql: &'a str) -> HarnessFuture<'a, Vec<i64>>;

    /// A session on the database `db` names, on one connection of the harness's own: it runs
    /// the core's statements with binds the adapter's test code builds from the core's values.
    fn session<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, Box<dyn crate::session::Session>>;

    /// Holds the advisory key `key` (the key's text, as the database renders it from the
    /// template) on a connection of the harness's own until the answer is released: what
    /// another process would do. Only where [`Capabilities::hold_key`] says yes.
    fn hold_key<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, Box<dyn HeldKey>> {
        let _ = (db, key);
        Box::pin(async { Err("this harness cannot hold a key of its own".into()) })
    }

    /// Kills, from the server side, the connection that holds the advisory key `key`, and
    /// answers whether it found one. Only where [`Capabilities::kill_connection`] says yes.
    fn kill_key_holder<'a>(&'a self, db: &'a str, key: &'a str) -> HarnessFuture<'a, bool> {
        let _ = (db, key);
        Box::pin(async { Err("this harness cannot kill a connection".into()) })
    }

    /// In one transaction on a connection of the harness's own driver, as a service holds one:
    /// runs `sql` (the service's own write), publishes `messages` into `T`'s table through the
    /// adapter's outbox, then ends the transaction as `end` says, answering what it wrote. [`TxEnd::Crash`] aborts the
    /// process with the transaction open, and so never answers.
    fn publish_in_transaction<'a, T: crate::rows::SuiteRow>(
        &'a self,
        db: &'a str,
        sql: &'a str,
        messages: Vec<ruststream::Message>,
        end: TxEnd,
    ) -> HarnessFuture<'a, Published>;

    /// Publishes `messages` into `T`'s table through the adapter's outbox on connections of a
    /// pool of its own (on SQLite, a connection), with no broker running.
    fn publish_without_broker<'a, T: crate::rows::SuiteRow>(
        &'a self,
        db: &'a str,
        messages: Vec<ruststream::Message>,
    ) -> HarnessFuture<'a, Published>;

    /// `T`'s table's counts through the adapter's outbox, on a connection of its own (a pool,
    /// on a server) with no broker running.
    fn outbox_stats<'a, T: crate::rows::SuiteRow>(
        &'a self,
        db: &'a str,
    ) -> HarnessFuture<'a, Stats>;

    /// Runs `sql` in the transaction the delivery of `ctx` lends its handler (the adapter's
    /// claim extractor): it commits with the acknowledgement and rolls back otherwise.
    fn write_in_claim<'a>(ctx: &'a mut Context<'_, InboxContext>, sql: String) -> ClaimFuture<'a>;

    /// Removes what [`Harness::prepare`] made, once a scenario passed (a failed one leaves it
    /// to look at). Nothing by default.
    fn cleanup<'a>(&'a self, db: &'a str) -> HarnessFuture<'a, ()> {
        let _ = db;
        Box::pin(async { Ok(()) })
    }
}

/// A harness that runs a scenario on the tables `F`: its adapter takes `F`'s rows of the
/// lease, advisory lock and custom lock forms, and its [`Harness::RowLock`] says whether it
/// takes the row lock form's. Every such harness implements it; each scenario names the tables
/// it needs, so a harness whose adapter does not take them fails to compile where the suite's
/// tests are generated.
pub trait Runs<F: Tables>: Harness {
    /// Runs `body` on `F`'s table of `form`, or answers why the form does not apply.
    fn on_form<'a, B: Body>(
        form: Form,
        body: B,
        cx: &'a Cx<'a, Self>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable>;
}

impl<H, F> Runs<F> for H
where
    H: Harness,
    F: Tables,
    H::Adapter: TakesRows<F::Lease> + TakesRows<F::Advisory> + TakesRows<F::Custom>,
    H::RowLock: RowLockTable<H, F::RowLock>,
{
    fn on_form<'a, B: Body>(
        form: Form,
        body: B,
        cx: &'a Cx<'a, H>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable> {
        match form {
            Form::Lease => Ok(body.run::<H, F::Lease>(cx)),
            Form::Advisory => Ok(body.run::<H, F::Advisory>(cx)),
            Form::Custom => Ok(body.run::<H, F::Custom>(cx)),
            Form::RowLock => H::RowLock::row_lock(body, cx),
        }
    }
}

/// Whether a harness's adapter takes the row lock form: [`RowLocks`] or [`NoRowLocks`].
pub trait RowLockSupport {
    /// Whether the form applies on `harness`, or why not.
    fn applies<H: Harness>(harness: &H) -> Result<(), NotApplicable>;
}

/// [`RowLockSupport`] on the row lock table `T`: runs a body there, where the form applies.
/// [`RowLocks`] implements it where the adapter takes `T`'s rows, [`NoRowLocks`] always.
pub trait RowLockTable<H: Harness, T: SuiteRow>: RowLockSupport {
    /// Runs `body` on `T`'s table, or answers why the form does not apply.
    fn row_lock<'a, B: Body>(
        body: B,
        cx: &'a Cx<'a, H>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable>;
}

/// The adapter takes the suite's row lock tables: PostgreSQL, MySQL, MariaDB.
#[derive(Clone, Copy, Debug)]
pub struct RowLocks;

/// The adapter does not take the row lock form: SQLite, which has no row locks.
#[derive(Clone, Copy, Debug)]
pub struct NoRowLocks;

impl RowLockSupport for RowLocks {
    fn applies<H: Harness>(_: &H) -> Result<(), NotApplicable> {
        Ok(())
    }
}

impl<H: Harness, T: SuiteRow> RowLockTable<H, T> for RowLocks
where
    H::Adapter: TakesRows<T>,
{
    fn row_lock<'a, B: Body>(
        body: B,
        cx: &'a Cx<'a, H>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable> {
        Ok(body.run::<H, T>(cx))
    }
}

impl RowLockSupport for NoRowLocks {
    fn applies<H: Harness>(harness: &H) -> Result<(), NotApplicable> {
        Err(NotApplicable {
            harness: harness.name(),
            reason: format!("{} has no row locks", harness.dialect().name()),
        })
    }
}

impl<H: Harness, T: SuiteRow> RowLockTable<H, T> for NoRowLocks {
    fn row_lock<'a, B: Body>(
        _: B,
        cx: &'a Cx<'a, H>,
    ) -> Result<LocalBoxFuture<'a, ()>, NotApplicable> {
        Err(Self::applies(cx.harness)
            .expect_err("NoRowLocks never applies: the error is its reason"))
    }
}
