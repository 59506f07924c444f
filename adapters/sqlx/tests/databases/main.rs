//! `ruststream-sqlx` on real databases: PostgreSQL at `RUSTSTREAM_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`), MariaDB at `RUSTSTREAM_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`), and SQLite files under the target directory.
//!
//! Each test works in a namespace of its own, named by the test and the process id (a
//! PostgreSQL schema, a MariaDB database, a SQLite file), and drops it at the end. A database
//! that does not answer fails the test with a message naming its URL.

mod adapter;
mod bad_rows;
mod common;
mod errors;
mod forms;
mod maintenance;
mod mariadb;
mod postgres;
mod schema;
mod sqlite;
mod wake;
