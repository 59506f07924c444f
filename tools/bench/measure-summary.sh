#!/bin/sh
# The leading table of BENCHMARKS.md: each form at 4, 24 and 64 workers on PostgreSQL (sqlx)
# and MariaDB (mysql-async) beside the limit loop, the same-statements loop and
# graphile-worker (plain beside the row lock and lease forms, its named queues beside the
# advisory form, at the same 100 keys); SQLite (rusqlite) at synchronous NORMAL (advisory one at a time, lease
# at 1 and 16 workers); apalis at 24
# workers; then each form with a transaction holding vacuum back (--hold-xmin) beside the same
# run without, 60,000 jobs each, with their timelines (`tools/bench/table.py --timeline`). Each line of target/bench/summary.jsonl is one run or one summary;
# `tools/bench/table.py --summary target/bench/summary.jsonl` prints the table.
# Usage: tools/bench/measure-summary.sh   (BENCH_JOBS, 20000; BENCH_ROUNDS, 2)
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
OUT="${BENCH_OUT:-target/bench/summary.jsonl}"
JOBS="${BENCH_JOBS:-20000}"
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
for spec in "advisory 1" "lease 1" "lease 16"; do
    set -- $spec
    run --adapter rusqlite --url sqlite:target/bench/rusqlite.db --form "$1" --jobs 20000 --workers "$2" \
        --rounds "$ROUNDS" --sqlite-synchronous normal
done
for form in row-lock lease advisory; do
    run --adapter sqlx --url "$PG" --form "$form" --jobs "$JOBS" --workers 24 --rounds "$ROUNDS" --peer apalis
done
for form in row-lock lease advisory; do
    run --adapter sqlx --url "$PG" --form "$form" --jobs 60000 --workers 24 --rounds 1 --no-baseline --timeline
    run --adapter sqlx --url "$PG" --form "$form" --jobs 60000 --workers 24 --rounds 1 --no-baseline --timeline --hold-xmin
done
uptime >&2
