#!/usr/bin/env python3
"""The SQLite advisory form's statements as a plain Python loop on one connection: select the
first due row, take it counting its attempt, delete it; WAL, synchronous NORMAL. The rate a
one-at-a-time SQLite queue is held against, beside the bench's own Rust loop.

Usage: python3 tools/bench/sqlite_loop.py [jobs] [path]   (default 20000 jobs, target/bench/loop.db)
"""

import os
import sqlite3
import sys
import time

jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
path = sys.argv[2] if len(sys.argv) > 2 else "target/bench/loop.db"
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(path + suffix):
        os.remove(path + suffix)
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("PRAGMA synchronous = NORMAL")
db.execute(
    "CREATE TABLE jobs (id INTEGER PRIMARY KEY, key TEXT NOT NULL, payload BLOB NOT NULL,"
    " attempt INTEGER NOT NULL DEFAULT 0, due_at INTEGER NOT NULL)"
)
db.execute("CREATE INDEX jobs_due ON jobs (due_at, id)")
db.execute("BEGIN")
db.executemany(
    "INSERT INTO jobs (key, payload, due_at) VALUES (?, ?, 0)",
    ((f"k{i % 100}", b"{}") for i in range(jobs)),
)
db.execute("COMMIT")

done = 0
start = time.perf_counter()
while True:
    now = int(time.time() * 1_000_000)
    row = db.execute(
        "SELECT id FROM jobs WHERE due_at <= ? ORDER BY due_at, id LIMIT 1", (now,)
    ).fetchone()
    if row is None:
        break
    taken = db.execute(
        "UPDATE jobs SET attempt = attempt + 1 WHERE id = ? RETURNING id, key, payload, attempt",
        row,
    ).fetchone()
    if taken is not None:
        db.execute("DELETE FROM jobs WHERE id = ?", row)
        done += 1
elapsed = time.perf_counter() - start
print(f"python sqlite3 loop: {done} jobs in {elapsed:.2f} s: {done / elapsed:.0f} jobs/s")
