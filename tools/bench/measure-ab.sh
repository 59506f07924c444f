#!/bin/sh
# Two builds of the bench side by side: the set of tools/bench/measure.sh, each combination run
# by the build A then the build B, so that the machine's drift falls on both alike; then the
# table of the A/B sections of tools/bench/results/ab.md and the geometric means of B/A.
# Usage: tools/bench/measure-ab.sh A-BINARY B-BINARY OUT-PREFIX [extra arguments]
# Each run's JSON goes to OUT-PREFIX-a.jsonl and OUT-PREFIX-b.jsonl.
set -eu
cd "$(dirname "$0")/../.."
A="$1"; B="$2"; OUT="$3"; shift 3
PG="${RUSTSTREAM_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
MY="${RUSTSTREAM_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
SIZE="${BENCH_SIZE:---jobs 2000 --workers 4 --rounds 3}"
mkdir -p "$(dirname "$OUT")" target/bench
rm -f "$OUT-a.jsonl" "$OUT-b.jsonl"
pair() {
    echo "+ A|B $* $SIZE $*" >&2
    "$A" "$@" $SIZE $EXTRA --quiet --json "$OUT-a.jsonl"
    "$B" "$@" $SIZE $EXTRA --quiet --json "$OUT-b.jsonl"
}
EXTRA="$*"
for form in row-lock lease advisory; do
    pair --adapter sqlx --url "$PG" --form "$form"
    pair --adapter sqlx --url "$MY" --form "$form"
done
for form in lease advisory; do
    pair --adapter sqlx --url sqlite:target/bench/sqlx.db --form "$form"
    pair --adapter rusqlite --url sqlite:target/bench/rusqlite.db --form "$form"
done
for form in row-lock lease advisory; do
    pair --adapter tokio-postgres --url "$PG" --form "$form"
    pair --adapter mysql-async --url "$MY" --form "$form"
done
python3 - "$OUT-a.jsonl" "$OUT-b.jsonl" <<'PY'
import json, math, sys
def summaries(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "summary":
            out.append(r)
    return out
a, b = summaries(sys.argv[1]), summaries(sys.argv[2])
def name(r):
    return f"{r.get('adapter')} {r.get('database')} {r.get('form')}"
keys = [("ruststream_jobs_per_s", "jobs/s"), ("limit_ratio_median", "÷ limit"), ("ratio_median", "÷ same")]
print("| combination | " + " | ".join(f"{t} A | B" for _, t in keys) + " |")
print("|---|" + "---|---|" * len(keys))
logs = {k: [] for k, _ in keys}
for x, y in zip(a, b):
    cells = []
    for k, _ in keys:
        vx, vy = x.get(k), y.get(k)
        cells.append(f"{vx:.2f} | {vy:.2f}" if isinstance(vx, float) and vx < 100 else f"{vx:.0f} | {vy:.0f}" if vx else "- | -")
        if vx and vy:
            logs[k].append(math.log(vy / vx))
    print(f"| {name(x)} | " + " | ".join(cells) + " |")
for k, t in keys:
    if logs[k]:
        print(f"geometric mean B/A of {t}: {math.exp(sum(logs[k]) / len(logs[k])):.3f} over {len(logs[k])}")
PY
