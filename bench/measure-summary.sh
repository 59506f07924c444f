#!/bin/sh
# The leading table of BENCHMARKS.md: each form at 4, 24 and 64 workers on PostgreSQL (sqlx)
# and MariaDB (mysql-async) beside the limit loop, the same-statements loop and
# graphile-worker (plain beside the row lock and lease forms, its named queues beside the
# advisory form, at the same 100 keys); SQLite (rusqlite) at synchronous NORMAL; apalis at 24
# workers; then each form with a transaction holding vacuum back (--hold-xmin) beside the same
# run without. Each line of target/bench/summary.jsonl is one run or one summary;
# `bench/table.py --summary target/bench/summary.jsonl` prints the table.
# Usage: bench/measure-summary.sh   (BENCH_JOBS, 5000; BENCH_ROUNDS, 2)
set -eu
cd "$(dirname "$0")/.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
OUT="${BENCH_OUT:-target/bench/summary.jsonl}"
JOBS="${BENCH_JOBS:-5000}"
ROUNDS="${BENCH_ROUNDS:-2}"
mkdir -p "$(dirname "$OUT")"
cargo build --release -p ruststream-bench
run() {
    echo "+ cargo run --release -p ruststream-bench -- $*" >&2
    ./target/release/ruststream-bench "$@" --quiet --json "$OUT"
}
for w in 4 24 64; do
    run --adapter sqlx --url "$PG" --form row-lock --jobs "$JOBS" --workers "$w" --rounds "$ROUNDS" --peer graphile
    run --adapter sqlx --url "$PG" --form lease --jobs "$JOBS" --workers "$w" --rounds "$ROUNDS" --peer graphile
    run --adapter sqlx --url "$PG" --form advisory --jobs "$JOBS" --workers "$w" --rounds "$ROUNDS" --peer graphile:queues
    for form in row-lock lease advisory; do
        run --adapter mysql-async --url "$MY" --form "$form" --jobs "$JOBS" --workers "$w" --rounds "$ROUNDS"
    done
done
for form in advisory lease; do
    run --adapter rusqlite --url sqlite:target/bench/rusqlite.db --form "$form" --jobs 20000 --workers 1 \
        --rounds "$ROUNDS" --sqlite-synchronous normal
done
for form in row-lock lease advisory; do
    run --adapter sqlx --url "$PG" --form "$form" --jobs "$JOBS" --workers 24 --rounds "$ROUNDS" --peer apalis
done
for form in row-lock lease advisory; do
    run --adapter sqlx --url "$PG" --form "$form" --jobs 30000 --workers 24 --rounds 1 --no-baseline
    run --adapter sqlx --url "$PG" --form "$form" --jobs 30000 --workers 24 --rounds 1 --no-baseline --hold-xmin
done
uptime >&2
