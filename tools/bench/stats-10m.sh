#!/usr/bin/env bash
# The cost of a table's counts on 10 million rows: builds `stats10m` (its schema from the
# command-line tool's `schema`) on PostgreSQL and MariaDB with 9.7 million rows due, 100,000
# each scheduled, failed and processed, and 67 held by a lease, then times `ruststream stats`
# (a release build; each run starts the process and connects) ten times on each, and drops
# the tables. Needs psql and mysql; URLs from RUSTSTREAM_PG_URL and RUSTSTREAM_MYSQL_URL.
set -euo pipefail
cd "$(dirname "$0")/../.."
PG=${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
MY=${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}
cargo build -q --release -p ruststream-cli
bin=target/release/ruststream
table=(--table stats10m --generated-id --payload payload --attempt attempt --due due_at
  --failed-at failed_at --processed-at processed_at --locked-until locked_until --error error)

my_args() { # mysql://user[:password]@host:port/db as the mysql client's flags
  local rest=${1#mysql://} auth host db
  auth=${rest%%@*}; rest=${rest#*@}; host=${rest%%/*}; db=${rest#*/}
  echo "-u${auth%%:*} -h${host%%:*} -P${host##*:} $db"
}

psql "$PG" -q -c "DROP TABLE IF EXISTS stats10m"
"$bin" schema --dialect postgres "${table[@]}" | psql "$PG" -q
psql "$PG" -q <<'SQL'
INSERT INTO stats10m (payload, attempt, due_at, locked_until, processed_at, failed_at, error)
SELECT '\x7b7d'::bytea, 0,
  CASE WHEN g % 100 = 1 THEN now() + interval '1 hour' ELSE now() - (g || ' milliseconds')::interval END,
  CASE WHEN g % 150000 = 7 THEN now() + interval '1 hour' END,
  CASE WHEN g % 100 = 2 THEN now() END,
  CASE WHEN g % 100 = 3 THEN now() END,
  CASE WHEN g % 100 = 3 THEN 'boom' END
FROM generate_series(1, 10000000) g;
VACUUM ANALYZE stats10m;
SQL

# shellcheck disable=SC2046
mysql $(my_args "$MY") -e "DROP TABLE IF EXISTS stats10m"
# shellcheck disable=SC2046
"$bin" schema --dialect mariadb "${table[@]}" | mysql $(my_args "$MY")
# shellcheck disable=SC2046
mysql $(my_args "$MY") <<'SQL'
INSERT INTO stats10m (payload, attempt, due_at, locked_until, processed_at, failed_at, error)
SELECT '{}', 0,
  IF(seq % 100 = 1, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6) - INTERVAL seq MICROSECOND),
  IF(seq % 150000 = 7, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, NULL),
  IF(seq % 100 = 2, UTC_TIMESTAMP(6), NULL),
  IF(seq % 100 = 3, UTC_TIMESTAMP(6), NULL),
  IF(seq % 100 = 3, 'boom', NULL)
FROM seq_1_to_10000000;
ANALYZE TABLE stats10m;
SQL

for url in "$PG" "$MY"; do
  "$bin" stats "$url" "${table[@]}"
  printf 'seconds per call:'
  for _ in $(seq 10); do
    s=$(date +%s.%N); "$bin" stats "$url" "${table[@]}" --json >/dev/null; e=$(date +%s.%N)
    printf ' %.2f' "$(echo "$e - $s" | bc)"
  done
  echo
done
psql "$PG" -q -c "DROP TABLE stats10m"
# shellcheck disable=SC2046
mysql $(my_args "$MY") -e "DROP TABLE stats10m"
