#!/bin/sh
# The wake-up set (tools/bench/results/wakeup.md): with a one-second poll interval and an idle
# subscription, publish to handler start, from the subscription's own broker and from a second
# broker, for every adapter, database and form. Each line of target/bench/wakeup.jsonl is one
# publisher.
# Usage: tools/bench/measure-wakeup.sh
set -eu
cd "$(dirname "$0")/../.."
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
OUT=target/bench/wakeup.jsonl
mkdir -p target/bench
cargo build --release -p ruststream-bench
run() {
    echo "+ $(uptime)" >&2
    echo "+ cargo run --release -p ruststream-bench -- $*" >&2
    ./target/release/ruststream-bench "$@"
}
run --scenario wakeup --adapter sqlx --url "$PG" --jobs 50 --quiet --json "$OUT"
run --scenario wakeup --adapter tokio-postgres --url "$PG" --jobs 50 --quiet --json "$OUT"
run --scenario wakeup --adapter sqlx --url "$MY" --jobs 50 --quiet --json "$OUT"
run --scenario wakeup --adapter mysql-async --url "$MY" --jobs 50 --quiet --json "$OUT"
run --scenario wakeup --adapter sqlx --url sqlite:target/bench/wakeup-sqlx.db --jobs 50 --quiet --json "$OUT"
run --scenario wakeup --adapter rusqlite --url sqlite:target/bench/wakeup-rusqlite.db --jobs 50 --quiet --json "$OUT"
