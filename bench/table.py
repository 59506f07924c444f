#!/usr/bin/env python3
"""Prints the markdown rows of BENCHMARKS.md's claim tables from the bench's JSON lines.

Usage: bench/table.py target/bench/results.jsonl [more.jsonl ...]
       bench/table.py --peer target/bench/peer.jsonl   (the "Beside a peer" rows, with
                                                       ruststream's prefetch beside apalis's batch)

One row per summary line (one invocation): the median jobs per second of each side over the
rounds, the median of the rounds' ratios (each round's in brackets), the pickup latencies, the
statements per job, the peak connections (the most over the invocation's runs) and the load
read at the end of each run.
"""
import json
import sys


def main(paths):
    if paths and paths[0] == "--peer":
        return peer(paths[1:])
    lines = []
    for path in paths:
        with open(path) as f:
            lines += [json.loads(l) for l in f if l.strip()]
    runs = [l for l in lines if l.get("kind") == "run"]
    for s in (l for l in lines if l.get("kind") == "summary"):
        mine = [r for r in runs if all(r.get(k) == s.get(k) for k in
                ("adapter", "database", "form", "workers", "handler_ms", "jobs", "prefetch"))
                and s["date"] >= r["date"]]
        mine = mine[-2 * s["rounds"]:]
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
        mine = mine[-3 * s["rounds"]:]
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


if __name__ == "__main__":
    main(sys.argv[1:])
