#!/bin/sh
# The "Beside a peer" set (tools/bench/results/apalis.md): on PostgreSQL, sqlx and
# tokio-postgres in the three forms, each round baseline, ruststream, then apalis
# (`--peer apalis`), first with a handler that does nothing (2000 jobs), then one that sleeps
# 10 ms (1000 jobs), then the lease form with apalis fetching 4 jobs at a time
# (`--peer apalis:4`) instead of 10, then the three forms with ruststream claiming 4 rows ahead
# (`--prefetch 4`) beside apalis's default. Each line of target/bench/peer.jsonl is one run or
# one summary; `uptime` goes to stderr before each.
# Usage: tools/bench/measure-peer.sh  (BENCH_BIN=path runs a binary built beforehand)
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
OUT="${BENCH_OUT:-target/bench/peer.jsonl}"
BIN="${BENCH_BIN:-}"
mkdir -p "$(dirname "$OUT")"
if [ -z "$BIN" ]; then
    cargo build --release -p ruststream-bench
    BIN=./target/release/ruststream-bench
fi
run() {
    uptime >&2
    echo "+ cargo run --release -p ruststream-bench -- $* --quiet --json $OUT" >&2
    "$BIN" "$@" --quiet --json "$OUT"
}
for adapter in sqlx tokio-postgres; do
    for form in row-lock lease advisory; do
        run --adapter "$adapter" --url "$PG" --form "$form" --jobs 2000 --workers 4 --rounds 3 \
            --peer apalis
    done
done
for adapter in sqlx tokio-postgres; do
    for form in row-lock lease advisory; do
        run --adapter "$adapter" --url "$PG" --form "$form" --jobs 1000 --workers 4 --rounds 3 \
            --handler-ms 10 --peer apalis
    done
done
for adapter in sqlx tokio-postgres; do
    run --adapter "$adapter" --url "$PG" --form lease --jobs 2000 --workers 4 --rounds 3 \
        --peer apalis:4
    run --adapter "$adapter" --url "$PG" --form lease --jobs 1000 --workers 4 --rounds 3 \
        --handler-ms 10 --peer apalis:4
done
for adapter in sqlx tokio-postgres; do
    for form in row-lock lease advisory; do
        run --adapter "$adapter" --url "$PG" --form "$form" --jobs 2000 --workers 4 --rounds 3 \
            --prefetch 4 --peer apalis
        run --adapter "$adapter" --url "$PG" --form "$form" --jobs 1000 --workers 4 --rounds 3 \
            --handler-ms 10 --prefetch 4 --peer apalis
    done
done
uptime >&2
