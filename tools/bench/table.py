#!/usr/bin/env python3
"""Prints the markdown rows of the claim tables (BENCHMARKS.md, tools/bench/results/) from JSON lines.

Usage: tools/bench/table.py target/bench/results.jsonl [more.jsonl ...]
       tools/bench/table.py --summary target/bench/summary.jsonl (BENCHMARKS.md's leading table:
                                                       ruststream beside the limit loop, the
                                                       same-statements loop and the peer)
       tools/bench/table.py --peer target/bench/peer.jsonl   (tools/bench/results/apalis.md's rows, with
                                                       ruststream's prefetch beside apalis's batch)
       tools/bench/table.py --scale target/bench/scale.jsonl (tools/bench/measure-scale.sh: processes, held
                                                       and hot keys, then the aims)
       tools/bench/table.py --timeline target/bench/xmin.jsonl (each run over time: one row per
                                                       tenth of the run: jobs/s, claim p50/p99,
                                                       dead tuples; --timeline keeps each run)

One row per summary line (one invocation): the median jobs per second of each side over the
rounds, the median of the rounds' ratios (each round's in brackets), the pickup latencies, the
statements per job, the peak connections (the most over the invocation's runs) and the load
read at the end of each run.
"""
import json
import sys


MATCH = ("adapter", "database", "form", "workers", "handler_ms", "jobs", "prefetch",
         "processes", "keys", "held_keys", "hot_keys", "hot_ms")


def main(paths):
    if paths and paths[0] == "--peer":
        return peer(paths[1:])
    if paths and paths[0] == "--scale":
        return scale(paths[1:])
    if paths and paths[0] == "--summary":
        return summary(paths[1:])
    if paths and paths[0] == "--timeline":
        return timeline(paths[1:])
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(l) for l in f if l.strip()]
    runs = [l for l in lines if l.get("kind") == "run"]
    for s in (l for l in lines if l.get("kind") == "summary"):
        mine = [r for r in runs if all(r.get(k) == s.get(k) for k in MATCH)
                and s["date"] >= r["date"]]
        mine = mine[-sides(s) * s["rounds"]:]
        rs = [r for r in mine if r["implementation"] == "ruststream"]
        base = [r for r in mine if r["implementation"] == "baseline"]
        peak = lambda rows: max((r.get("peak_connections") or 0) for r in rows) if rows else "-"
        loads = [r.get("load1") for r in mine if r.get("load1") is not None]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "-"
        ratios = ", ".join(f"{x:.2f}" for x in s["ratios"])
        print(
            f"| {s['adapter']} | {s['database']} | {s['form']} | {s['workers']} | "
            f"{s['handler_ms']} ms | {s['ruststream_jobs_per_s']:.0f} | "
            f"{s['baseline_jobs_per_s']:.0f} | **{s['ratio_median']:.2f}** ({ratios}) | "
            f"{s['ruststream_pickup_p50_ms']:.0f} / {s['ruststream_pickup_p99_ms']:.0f} | "
            f"{s['baseline_pickup_p50_ms']:.0f} / {s['baseline_pickup_p99_ms']:.0f} | "
            f"{s['ruststream_statements_per_job']:.1f} / {s['baseline_statements_per_job']:.1f} | "
            f"{peak(rs)} / {peak(base)} | {load} | {s['date']} | `{s['command']}` |"
        )


def peer(paths):
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(l) for l in f if l.strip()]
    runs = [l for l in lines if l.get("kind") == "run"]
    for s in (l for l in lines if l.get("kind") == "summary" and l.get("peer")):
        mine = [r for r in runs if all(r.get(k) == s.get(k) for k in
                ("adapter", "database", "form", "workers", "handler_ms", "jobs", "prefetch"))
                and s["date"] >= r["date"]]
        mine = mine[-sides(s) * s["rounds"]:]
        by = lambda side: [r for r in mine if r["implementation"] == side]
        rs, base, ap = by("ruststream"), by("baseline"), by("apalis")
        peak = lambda rows: max((r.get("peak_connections") or 0) for r in rows) if rows else "-"
        loads = [r.get("load1") for r in mine if r.get("load1") is not None]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "-"
        last_ap = ap[-1]
        begins = last_ap["statements"].get("COMMIT", 0) / s["jobs"]
        pairs = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
        med = lambda side, k: sorted(r[k] for r in side)[len(side) // 2]
        print(
            f"| {s['adapter']} | {s['form']} | {s['handler_ms']} ms | {s.get('prefetch', 0)} | "
            f"{s['peer_batch_size']} | "
            f"{s['ruststream_jobs_per_s']:.0f} | {s['peer_jobs_per_s']:.0f} | "
            f"{s['baseline_jobs_per_s']:.0f} | **{s['peer_ratio_median']:.2f}** "
            f"({pairs(s['peer_ratios'])}) | {s['ratio_median']:.2f} ({pairs(s['ratios'])}) | "
            f"{s['ruststream_pickup_p50_ms']:.0f} / {s['ruststream_pickup_p99_ms']:.0f} | "
            f"{s['peer_pickup_p50_ms']:.0f} / {s['peer_pickup_p99_ms']:.0f} | "
            f"{s['baseline_pickup_p50_ms']:.0f} / {s['baseline_pickup_p99_ms']:.0f} | "
            f"{s['ruststream_statements_per_job']:.2f} / {last_ap['statements_per_job']:.2f} + "
            f"{begins:.2f} | {peak(rs)} / {peak(ap)} / {peak(base)} | {load} | {s['date']} | "
            f"`{s['command']}` |"
        )


def scale(paths):
    """The rows of tools/bench/measure-scale.sh's runs, one per summary, then the aims: three
    processes against one, a held key against none, by adapter and database (and handler, jobs
    and workers), each from the last invocation of its settings."""
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(l) for l in f if l.strip()]
    runs = [l for l in lines if l.get("kind") == "run"]
    summaries = [l for l in lines if l.get("kind") == "summary"]
    print("| adapter | database | processes | keys | held | hot | handler | ruststream jobs/s | "
          "baseline jobs/s | median ratio (rounds) | rows per process (last round) | "
          "pickup p50 / p99 ms, ruststream | order checked | load1 | date (UTC) | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        mine = [r for r in runs if all(r.get(k) == s.get(k) for k in MATCH)
                and s["date"] >= r["date"]]
        mine = mine[-sides(s) * s["rounds"]:]
        rs = [r for r in mine if r["implementation"] == "ruststream"]
        loads = [r.get("load1") for r in mine if r.get("load1") is not None]
        load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "-"
        ratios = ", ".join(f"{x:.2f}" for x in s["ratios"])
        per = rs[-1].get("per_process_jobs") if rs else None
        per = " / ".join(str(n) for n in per) if per else "-"
        hot = f"{s['hot_keys']} × {s['hot_ms']} ms" if s.get("hot_keys") else "-"
        held = s.get("held_keys") or "-"
        print(
            f"| {s['adapter']} | {s['database']} | {s.get('processes', 1)} | {s['keys']} | "
            f"{held} | {hot} | {s['handler_ms']} ms | {num(s['ruststream_jobs_per_s'])} | "
            f"{num(s['baseline_jobs_per_s'])} | **{num(s['ratio_median'], 2)}** ({ratios}) | "
            f"{per} | {num(s['ruststream_pickup_p50_ms'])} / "
            f"{num(s['ruststream_pickup_p99_ms'])} | "
            f"{'yes' if s.get('order_checked') else 'no'} | {load} | {s['date']} | "
            f"`{s['command']}` |"
        )
    print()
    print("| adapter | database | aim | ruststream | baseline | measured | met |")
    print("|---|---|---|---|---|---|---|")
    group = ("adapter", "database", "form", "workers", "handler_ms", "jobs", "prefetch")
    for g in sorted({tuple(s.get(k) for k in group) for s in summaries}, key=str):
        mine = [s for s in summaries if tuple(s.get(k) for k in group) == g]
        adapter, database = g[0], g[1]

        def last(**want):
            found = [s for s in mine if all(s.get(k, 0 if k != "processes" else 1) == v
                                            for k, v in want.items())]
            return found[-1] if found else None

        one = last(keys=40, processes=1, held_keys=0, hot_keys=0)
        three = last(keys=40, processes=3, held_keys=0, hot_keys=0)
        if one and three:
            rate = three["ruststream_jobs_per_s"] / one["ruststream_jobs_per_s"]
            limit = three["ruststream_jobs_per_s"] / three["baseline_jobs_per_s"]
            met = rate >= 2.5 or limit >= 0.9
            print(
                f"| {adapter} | {database} | 3 processes ≥ 2.5 × 1 (or ≥ 0.90 × the raw loop "
                f"at 3 × W) | {num(one['ruststream_jobs_per_s'])} → "
                f"{num(three['ruststream_jobs_per_s'])} | {num(one['baseline_jobs_per_s'])} → "
                f"{num(three['baseline_jobs_per_s'])} | **{rate:.2f}×** (of the raw loop: "
                f"{limit:.2f}) | {'yes' if met else 'no'} |"
            )
        free = last(keys=5, processes=1, held_keys=0, hot_keys=0)
        held = last(keys=5, processes=1, held_keys=1, hot_keys=0)
        if free and held:
            rate = held["ruststream_jobs_per_s"] / free["ruststream_jobs_per_s"]
            base = held["baseline_jobs_per_s"] / free["baseline_jobs_per_s"]
            print(
                f"| {adapter} | {database} | free keys with 1 of 5 held ≥ 0.90 × without | "
                f"{num(free['ruststream_jobs_per_s'])} → {num(held['ruststream_jobs_per_s'])} | "
                f"{num(free['baseline_jobs_per_s'])} → {num(held['baseline_jobs_per_s'])} | "
                f"**{rate:.2f}** (raw loop: {base:.2f}) | {'yes' if rate >= 0.9 else 'no'} |"
            )
        checked = [s for s in mine if s.get("form") == "advisory"]
        if checked:
            ok = all(s.get("order_checked") for s in checked)
            print(
                f"| {adapter} | {database} | per-key order checked in every advisory run | - | "
                f"- | {sum(1 for s in checked if s.get('order_checked'))} of {len(checked)} "
                f"invocations | {'yes' if ok else 'no'} |"
            )


def num(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def sides(s):
    """How many runs each round of a summary's invocation has: ruststream and the baseline, the
    limit loop and the peer where the summary names them."""
    return (2 + (s.get("limit_jobs_per_s") is not None)
            + (s.get("peer_jobs_per_s") is not None))


def summary(paths):
    """One row per invocation: ruststream's median jobs per second beside the limit loop, the
    same-statements loop and the peer, with each ratio ruststream / other."""
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(l) for l in f if l.strip()]
    print("| database | adapter | form | workers | ruststream jobs/s | limit loop | ruststream / "
          "limit | same statements | ruststream / same | peer | ruststream / peer | "
          "statements per job, ruststream / limit | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in (l for l in lines if l.get("kind") == "summary"):
        peer = "-"
        peer_ratio = "-"
        if s.get("peer_jobs_per_s") is not None:
            peer = f"{s.get('peer', 'peer')} {num(s['peer_jobs_per_s'])}"
            peer_ratio = f"**{num(s.get('peer_ratio_median'), 2)}**"
        print(
            f"| {s['database']} | {s['adapter']} | {s['form']} | {s['workers']} | "
            f"{num(s['ruststream_jobs_per_s'])} | {num(s.get('limit_jobs_per_s'))} | "
            f"**{num(s.get('limit_ratio_median'), 2)}** | {num(s['baseline_jobs_per_s'])} | "
            f"{num(s['ratio_median'], 2)} | {peer} | {peer_ratio} | "
            f"{num(s['ruststream_statements_per_job'], 1)} / "
            f"{num(s.get('limit_statements_per_job'), 1)} | `{s['command']}` |"
        )


def timeline(paths):
    """Each run with a timeline: a heading, then one row per tenth of the run (the mean of its
    seconds' rates, the largest p99 of its claims, the dead tuples at its end)."""
    for path in paths:
        with open(path) as f:
            runs = [json.loads(l) for l in f if l.strip()]
        for r in (r for r in runs if r.get("kind") == "run" and r.get("timeline")):
            t = r["timeline"]
            print(f"\n{r['implementation']} {r['adapter']} {r['database']} {r['form']} "
                  f"W={r['workers']} jobs={r['jobs']}: {r['jobs_per_s']:.0f} jobs/s, claim p50 "
                  f"{num(r.get('claim_p50_ms'), 1)} p99 {num(r.get('claim_p99_ms'), 1)} ms, "
                  f"pickup p99 {num(r.get('pickup_p99_ms'))} ms, {r['date']}\n")
            print("| seconds | jobs/s | claim p50 ms | claim p99 ms | dead tuples | live tuples |")
            print("|---|---|---|---|---|---|")
            step = max(1, len(t) // 10)
            for i in range(0, len(t), step):
                part = t[i:i + step]
                rate = sum(s["jobs_per_s"] for s in part) / len(part)
                p50 = [s["claim_p50_ms"] for s in part if s.get("claim_p50_ms") is not None]
                p99 = [s["claim_p99_ms"] for s in part if s.get("claim_p99_ms") is not None]
                last = part[-1]
                start = t[i - 1]["t_s"] if i > 0 else 0.0
                print(f"| {start:.0f}-{last['t_s']:.0f} | {rate:.0f} | "
                      f"{num(sum(p50) / len(p50) if p50 else None, 1)} | "
                      f"{num(max(p99) if p99 else None, 1)} | {num(last.get('dead_tuples'))} | "
                      f"{num(last.get('live_tuples'))} |")


if __name__ == "__main__":
    main(sys.argv[1:])
