#!/bin/sh
# The set beside the same-statements loop (tools/bench/results/same-statements.md): sqlx on
# PostgreSQL and MariaDB in the three forms, sqlx and rusqlite on SQLite in the lease and
# advisory forms, then tokio-postgres and mysql-async. Each line of target/bench/results.jsonl
# is one run or one summary.
# Usage: tools/bench/measure.sh [extra arguments for every invocation, such as --handler-ms 10]
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
OUT="${BENCH_OUT:-target/bench/results.jsonl}"
SIZE="${BENCH_SIZE:---jobs 2000 --workers 4 --rounds 3}"
mkdir -p "$(dirname "$OUT")"
cargo build --release -p ruststream-bench
run() {
    echo "+ cargo run --release -p ruststream-bench -- $* $SIZE $EXTRA" >&2
    ./target/release/ruststream-bench "$@" $SIZE $EXTRA --quiet --json "$OUT"
}
EXTRA="$*"
for form in row-lock lease advisory; do
    run --adapter sqlx --url "$PG" --form "$form"
    run --adapter sqlx --url "$MY" --form "$form"
done
for form in lease advisory; do
    run --adapter sqlx --url sqlite:target/bench/sqlx.db --form "$form"
    run --adapter rusqlite --url sqlite:target/bench/rusqlite.db --form "$form"
done
for form in row-lock lease advisory; do
    run --adapter tokio-postgres --url "$PG" --form "$form"
    run --adapter mysql-async --url "$MY" --form "$form"
done
