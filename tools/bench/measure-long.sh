#!/bin/sh
# The lease form at scale and the long horizon, on PostgreSQL (sqlx), each run with its
# timeline (`tools/bench/table.py --timeline target/bench/long.jsonl`):
# - the lease form at 64 and 128 workers, 100,000 jobs, without and with rows claimed ahead
#   (`--prefetch` = the workers), an empty handler and a 1-ms one;
# - a 1-million-row backlog drained at 64 workers in each form (the lease form with rows
#   claimed ahead), and the lease form's again with a transaction held open elsewhere for the
#   whole run (`--hold-xmin`).
# Usage: tools/bench/measure-long.sh   (BENCH_OUT, target/bench/long.jsonl)
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
OUT="${BENCH_OUT:-target/bench/long.jsonl}"
mkdir -p "$(dirname "$OUT")"
cargo build --release -p ruststream-bench
run() {
    echo "+ cargo run --release -p ruststream-bench -- $*" >&2
    ./target/release/ruststream-bench --adapter sqlx --url "$PG" --rounds 1 --no-baseline \
        --timeline --quiet --json "$OUT" "$@"
}
for w in 64 128; do
    for ms in 0 1; do
        run --form lease --jobs 100000 --workers "$w" --handler-ms "$ms"
        run --form lease --jobs 100000 --workers "$w" --handler-ms "$ms" --prefetch "$w"
    done
done
run --form lease --jobs 1000000 --workers 64 --prefetch 64
run --form lease --jobs 1000000 --workers 64 --prefetch 64 --hold-xmin
run --form row-lock --jobs 1000000 --workers 64
run --form advisory --jobs 1000000 --workers 64
uptime >&2
