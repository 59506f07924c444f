//! A table that names no form takes its rows by row lock, and SQLite has no row locks: a
//! subscription to such a table through a SQLite broker does not compile, and the error names
//! the rule. A table whose description names its message (`message = Report`) is decoded as
//! that message: a subscriber of another does not compile.

#[test]
fn row_lock_on_sqlite_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/row_lock_on_sqlite.rs");
    t.pass("tests/ui/row_lock_on_postgres.rs");
    t.compile_fail("tests/ui/message_other_than_the_tables.rs");
    t.pass("tests/ui/message_of_the_table.rs");
}
