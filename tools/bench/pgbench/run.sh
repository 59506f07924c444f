#!/bin/sh
# The row lock form's job beside a lease-like one in plain SQL, on pgbench: each script on a
# fresh queue of 20,000 jobs (setup.sql), C clients, 4,000 jobs a client, in turn, twice.
# Usage: tools/bench/pgbench/run.sh [clients]   (RUSTSTREAM_PG_URL, default postgres://postgres@127.0.0.1:5432/test)
set -eu
cd "$(dirname "$0")"
URL="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
CLIENTS="${1:-4}"
for round in 1 2; do
    for script in row_lock row_lock_pipelined claim_delete; do
        psql -q "$URL" -f setup.sql >/dev/null
        tps=$(pgbench -n -M prepared -c "$CLIENTS" -j 2 -t 4000 -f "$script.sql" "$URL" 2>&1 |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        echo "round $round $script clients=$CLIENTS: $tps jobs/s"
    done
done
psql -q "$URL" -c 'DROP TABLE pgbench_jobs' >/dev/null
