#!/bin/sh
# The scaling set: the advisory form with a 40 ms handler, 4 workers a process, 1000 jobs, on
# PostgreSQL (sqlx, tokio-postgres) and MariaDB (sqlx, mysql-async), each round the raw loop
# (the baseline) then ruststream on the same table:
#   - 40 keys, one process, then three (`--processes 3`: the baseline runs 3 × 4 tasks);
#   - 5 keys, then 5 keys with one held by a session of the bench's own for the whole run
#     (`--held-keys 1`: the rate counts the four free keys' rows);
#   - 40 keys, two of them hot (`--hot-keys 2 --hot-ms 400`: their rows take 400 ms).
# Every advisory run checks each key's order (`order_checked`). Each line of
# target/bench/scale.jsonl (or $BENCH_OUT) is one run or one summary; `uptime` goes to stderr
# before each invocation. `tools/bench/table.py --scale FILE` prints the rows and the aims.
# Usage: tools/bench/measure-scale.sh [extra arguments for every invocation]
#        (BENCH_ROUNDS=R for R rounds, 3 by default; BENCH_BIN=path runs a binary built
#        beforehand)
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
OUT="${BENCH_OUT:-target/bench/scale.jsonl}"
ROUNDS="${BENCH_ROUNDS:-3}"
BIN="${BENCH_BIN:-}"
mkdir -p "$(dirname "$OUT")"
if [ -z "$BIN" ]; then
    cargo build --release -p ruststream-bench
    # A copy of the binary: other builds in the same target directory replace the original,
    # and the children of `--processes` run the parent's own binary.
    BIN=target/bench/ruststream-bench-scale
    cp target/release/ruststream-bench "$BIN"
fi
EXTRA="$*"
SIZE="--form advisory --handler-ms 40 --workers 4 --jobs 1000 --rounds $ROUNDS"
run() {
    uptime >&2
    echo "+ cargo run --release -p ruststream-bench -- $* $SIZE $EXTRA --quiet --json $OUT" >&2
    "$BIN" "$@" $SIZE $EXTRA --quiet --json "$OUT"
}
for target in "sqlx $PG" "tokio-postgres $PG" "sqlx $MY" "mysql-async $MY"; do
    set -- $target
    adapter="$1"
    url="$2"
    run --adapter "$adapter" --url "$url" --keys 40 --processes 1
    run --adapter "$adapter" --url "$url" --keys 40 --processes 3
    run --adapter "$adapter" --url "$url" --keys 5
    run --adapter "$adapter" --url "$url" --keys 5 --held-keys 1
    run --adapter "$adapter" --url "$url" --keys 40 --hot-keys 2 --hot-ms 400
done
uptime >&2
