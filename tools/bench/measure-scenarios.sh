#!/bin/sh
# The growth and publish sets (tools/bench/results/growth.md, tools/bench/results/publishing.md).
# Growth: the claim's latency with 10 thousand, 1 million and 10 million rows, 1000 of them due,
# with the claim's index (due_at, id) and without it, on PostgreSQL, MariaDB and SQLite (sqlx);
# each line of target/bench/growth.jsonl is one size and form. Publish: rows per second through
# ruststream's Publisher beside raw inserts, each adapter, 1, 4 and 16 in flight; each line of
# target/bench/publish.jsonl is one run or one summary.
# Usage: tools/bench/measure-scenarios.sh [growth|publish]   (both without an argument)
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
mkdir -p target/bench
cargo build --release -p ruststream-bench
# A copy of the binary: other builds in the same target directory replace the original.
BIN=target/bench/ruststream-bench-scenarios
cp target/release/ruststream-bench "$BIN"
run() {
    echo "+ $(uptime)" >&2
    echo "+ cargo run --release -p ruststream-bench -- $*" >&2
    "$BIN" "$@"
}
WHAT="${1:-all}"
if [ "$WHAT" = all ] || [ "$WHAT" = growth ]; then
    OUT=target/bench/growth.jsonl
    for url in "$PG" "$MY" sqlite:target/bench/growth.db; do
        run --scenario growth --adapter sqlx --url "$url" --rows 10000,1000000,10000000 \
            --quiet --json "$OUT"
    done
    # Without the index the claim reads the whole table: fewer claims at the larger sizes.
    for url in "$PG" "$MY" sqlite:target/bench/growth.db; do
        run --scenario growth --adapter sqlx --url "$url" --rows 10000 --index none \
            --quiet --json "$OUT"
        run --scenario growth --adapter sqlx --url "$url" --rows 1000000 --index none \
            --claims 50 --quiet --json "$OUT"
    done
    run --scenario growth --adapter sqlx --url "$PG" --rows 10000000 --index none \
        --claims 20 --quiet --json "$OUT"
    run --scenario growth --adapter sqlx --url "$MY" --rows 10000000 --index none \
        --claims 20 --quiet --json "$OUT"
    run --scenario growth --adapter sqlx --url sqlite:target/bench/growth.db --rows 10000000 \
        --index none --claims 20 --quiet --json "$OUT"
fi
if [ "$WHAT" = all ] || [ "$WHAT" = publish ]; then
    OUT=target/bench/publish.jsonl
    SIZE="--jobs 10000 --batch-jobs 50000 --concurrency 1,4,16 --rounds 3"
    run --scenario publish --adapter sqlx --url "$PG" $SIZE --quiet --json "$OUT"
    run --scenario publish --adapter tokio-postgres --url "$PG" $SIZE --quiet --json "$OUT"
    run --scenario publish --adapter sqlx --url "$MY" $SIZE --quiet --json "$OUT"
    run --scenario publish --adapter mysql-async --url "$MY" $SIZE --quiet --json "$OUT"
    run --scenario publish --adapter sqlx --url sqlite:target/bench/publish-sqlx.db $SIZE \
        --quiet --json "$OUT"
    run --scenario publish --adapter rusqlite --url sqlite:target/bench/publish-rusqlite.db \
        $SIZE --quiet --json "$OUT"
fi
