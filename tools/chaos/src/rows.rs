//! The queue table `chaos_jobs` in each form, as row types every adapter decodes, and its
//! DDL.
//!
//! Each run has a database of its own, so the table's name is the same in every run. The
//! table keeps failed rows (`failed_at`, `error`) and has a due column, which retries write;
//! `k` is the column of the advisory key `chaos-{k}`. In poison_rows the table is bare, as the
//! spec's own tables are: no due column, no `failed_at`, no error column, so a row that fails
//! has nowhere to wait its delay (but the lease form's lease) and nowhere to be kept failed.

use ruststream::{
    Advisory, Attempt, Column, Due, ErrorText, Failed, InboxSpec, InboxTable, KeyPart, Lease,
    Payload, PayloadRow,
};
use serde::Deserialize;

/// The queue table's name.
pub const TABLE: &str = "chaos_jobs";
/// The handlers' log's name.
pub const LOG: &str = "chaos_log";
/// The table of every id published, kept after the rows settle (for the lock checks).
pub const IDS: &str = "chaos_ids";
/// poison_rows: one job in this many carries a payload that does not decode (job ids `n` with
/// `n % POISON_EVERY == POISON_AT`).
pub const POISON_EVERY: i64 = 100;
/// See [`POISON_EVERY`].
pub const POISON_AT: i64 = 7;
/// The payload of a poison row: not JSON.
pub const POISON_PAYLOAD: &str = "not json";

/// Whether job `id` is a poison row in poison_rows.
pub fn poisoned(id: i64) -> bool {
    id % POISON_EVERY == POISON_AT
}

/// The SQL condition of the poison rows (PostgreSQL and MySQL alike).
pub fn poison_sql() -> String {
    format!("MOD(id, {POISON_EVERY}) = {POISON_AT}")
}

/// The advisory key's literal prefix.
pub const KEY_PREFIX: &str = "chaos-";
/// The advisory key: `chaos-{k}`.
const KEY: &[KeyPart] = &[KeyPart::Literal(KEY_PREFIX), KeyPart::Column("k")];

macro_rules! row_type {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $spec:expr) => {
        $(#[$doc])*
        #[derive(Debug, Deserialize, sqlx::FromRow)]
        pub struct $name {
            id: i64,
            payload: Vec<u8>,
        }

        impl InboxTable for $name {
            type Id = i64;
            type Table = $ty;
            const TABLE: $ty = $spec;

            fn id(&self) -> &i64 {
                &self.id
            }
        }

        impl PayloadRow for $name {
            type Column = Vec<u8>;

            fn payload(&self) -> &[u8] {
                &self.payload
            }
        }

        impl mysql_async::prelude::FromRow for $name {
            fn from_row_opt(row: mysql_async::Row) -> Result<Self, mysql_async::FromRowError> {
                let id = row.get_opt::<i64, _>("id").and_then(Result::ok);
                let payload = row.get_opt::<Vec<u8>, _>("payload").and_then(Result::ok);
                match (id, payload) {
                    (Some(id), Some(payload)) => Ok(Self { id, payload }),
                    _ => Err(mysql_async::FromRowError(row)),
                }
            }
        }
    };
}

row_type!(
    /// A row of `chaos_jobs` in the row lock form.
    RowLockJob,
    InboxSpec<(Attempt, Payload, Due, Failed, ErrorText)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"))
);

row_type!(
    /// A row of `chaos_jobs` in the lease form.
    LeaseJob,
    InboxSpec<(Lease, Attempt, Payload, Due, Failed, ErrorText)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .lease(Column::new("locked_until"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"))
);

row_type!(
    /// A row of `chaos_jobs` in the advisory lock form, keyed `chaos-{k}`.
    AdvisoryJob,
    InboxSpec<(Advisory, Attempt, Payload, Due, Failed, ErrorText)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
        .due(Column::new("due_at"))
        .failed(Column::new("failed_at"))
        .error(Column::new("error"))
);

row_type!(
    /// A row of the bare `chaos_jobs` in the row lock form.
    BareRowLockJob,
    InboxSpec<(Attempt, Payload)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

row_type!(
    /// A row of the bare `chaos_jobs` in the lease form.
    BareLeaseJob,
    InboxSpec<(Lease, Attempt, Payload)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .lease(Column::new("locked_until"))
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

row_type!(
    /// A row of the bare `chaos_jobs` in the advisory lock form, keyed `chaos-{k}`.
    BareAdvisoryJob,
    InboxSpec<(Advisory, Attempt, Payload)>,
    InboxSpec::new(TABLE, Column::new("id").generated())
        .advisory(KEY)
        .attempt(Column::new("attempt").generated())
        .payload(Column::new("payload"))
);

/// The statements that create the run's tables: the queue table (with `locked_until` in the
/// lease form; bare: without `due_at`, `failed_at` and `error`) and its claim index, and the
/// log.
pub fn create(postgres: bool, lease: bool, bare: bool) -> Vec<String> {
    if postgres {
        let lease = if lease {
            ", locked_until TIMESTAMPTZ"
        } else {
            ""
        };
        let (kept, index) = if bare {
            ("", format!("CREATE INDEX {TABLE}_claim ON {TABLE} (id)"))
        } else {
            (
                ", due_at TIMESTAMPTZ NOT NULL DEFAULT 'epoch', failed_at TIMESTAMPTZ, error TEXT",
                format!(
                    "CREATE INDEX {TABLE}_claim ON {TABLE} (due_at, id) WHERE failed_at IS NULL"
                ),
            )
        };
        vec![
            format!(
                "CREATE TABLE {TABLE} (id BIGSERIAL PRIMARY KEY, k BIGINT NOT NULL DEFAULT 0, \
                 attempt BIGINT NOT NULL DEFAULT 0, payload BYTEA NOT NULL{kept}{lease})"
            ),
            index,
            format!(
                "CREATE TABLE {LOG} (spawn BIGINT NOT NULL, seq BIGINT NOT NULL, \
                 job BIGINT NOT NULL, attempt BIGINT NOT NULL, key TEXT, pid BIGINT NOT NULL, \
                 start_us BIGINT NOT NULL, end_us BIGINT, outcome TEXT, \
                 PRIMARY KEY (spawn, seq))"
            ),
        ]
    } else {
        let lease = if lease {
            ", locked_until DATETIME(6) NULL"
        } else {
            ""
        };
        let kept = if bare {
            String::new()
        } else {
            format!(
                ", due_at DATETIME(6) NOT NULL DEFAULT '1970-01-02 00:00:00', \
                 failed_at DATETIME(6) NULL, error TEXT, \
                 INDEX {TABLE}_claim (failed_at, due_at, id)"
            )
        };
        vec![
            format!(
                "CREATE TABLE {TABLE} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 k BIGINT NOT NULL DEFAULT 0, attempt BIGINT NOT NULL DEFAULT 0, \
                 payload LONGBLOB NOT NULL{kept}{lease}) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE {LOG} (spawn BIGINT NOT NULL, seq BIGINT NOT NULL, \
                 job BIGINT NOT NULL, attempt BIGINT NOT NULL, `key` VARCHAR(255), \
                 pid BIGINT NOT NULL, start_us BIGINT NOT NULL, end_us BIGINT, \
                 outcome VARCHAR(16), PRIMARY KEY (spawn, seq)) ENGINE=InnoDB"
            ),
        ]
    }
}
