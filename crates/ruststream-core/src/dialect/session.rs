//! The statements of a session's locks and checks: a key's lock and unlock, and the session
//! check's ping and probe.

use super::{Arg, ColumnType, Dialect, Sql, Statement, StatementKind, named};

// The first statement of the session check's second connection, before the probe key is
// locked: `SELECT pg_backend_pid()`, which answers a row, so an adapter that prepares its
// statements prepares it. Where the connection's server session holds another client's
// prepared statement of the same name (a pooler in transaction pooling), it fails before any
// lock is taken, and no lock is left on a server session other clients use.
// Rendered once for the process.
pub(crate) fn session_ping() -> Statement {
    static PING: std::sync::LazyLock<Statement> = std::sync::LazyLock::new(|| {
        let mut s = Sql::new(Dialect::Postgres);
        s.push("SELECT pg_backend_pid() AS pid");
        s.finish(StatementKind::Ping, named(&[("pid", ColumnType::Int)]))
    });
    PING.clone()
}

/// Whether a lock statement takes its lock (without waiting) or releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LockCall {
    Lock,
    Unlock,
}

/// A key's lock or its unlock in `dialect`, answering one boolean: PostgreSQL's session lock
/// (`pg_try_advisory_lock`), `GET_LOCK` with no wait elsewhere. The advisory lock form's
/// keys, and the probe of the session check ([`session_probe`]).
pub(super) fn key_lock(dialect: Dialect, call: LockCall) -> Statement {
    let mut s = Sql::new(dialect);
    let (kind, column) = match call {
        LockCall::Lock => (StatementKind::TryLock, "locked"),
        LockCall::Unlock => (StatementKind::Unlock, "unlocked"),
    };
    match (dialect, call) {
        (Dialect::Postgres, LockCall::Lock) => s.push("SELECT pg_try_advisory_lock(").arg(Arg::Key),
        (Dialect::Postgres, LockCall::Unlock) => s.push("SELECT pg_advisory_unlock(").arg(Arg::Key),
        (_, LockCall::Lock) => s.push("SELECT GET_LOCK(").arg(Arg::Key).push(", 0"),
        (_, LockCall::Unlock) => s.push("SELECT RELEASE_LOCK(").arg(Arg::Key),
    };
    s.push(") AS ").push(column);
    s.finish(kind, named(&[(column, ColumnType::Bool)]))
}

// The probe of the session check on PostgreSQL, for a form that holds no session lock but
// runs on an adapter whose prepared statements live in the server session
// ([`Broker::set_prepared_statements`](crate::Broker::set_prepared_statements)): a key's
// session lock and its unlock.
pub(crate) fn session_probe() -> (Statement, Statement) {
    (
        key_lock(Dialect::Postgres, LockCall::Lock),
        key_lock(Dialect::Postgres, LockCall::Unlock),
    )
}
