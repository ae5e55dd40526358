"""How many events per second the store's single writer commits (prints figures, asserts nothing).

Run: ``python benchmarks/store_events.py [events_per_stream]`` from the repository root.

Three shapes, each with synchronous=FULL (the default) and NORMAL:
- one stream, each append awaited before the next (a single generation);
- 8 streams on 8 threads, each awaiting its own appends (group commit shares fsyncs);
- 8 streams, appends submitted without waiting, then awaited (the writer's ceiling).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmsp_tray.store import Database, event_log

DATA = '{"type":"response.output_text.delta","sequence_number":%d,"delta":" token"}'


def one_stream(db: Database, n: int) -> float:
    start = time.perf_counter()
    for seq in range(1, n + 1):
        db.write_sync(event_log.append_events, "task_one", [(seq, "response.output_text.delta", DATA % seq)])
    return n / (time.perf_counter() - start)


def threaded_streams(db: Database, n: int, streams: int = 8) -> float:
    def run(owner: str) -> None:
        for seq in range(1, n + 1):
            db.write_sync(event_log.append_events, owner, [(seq, "response.output_text.delta", DATA % seq)])

    threads = [threading.Thread(target=run, args=(f"task_thr{i}",)) for i in range(streams)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return streams * n / (time.perf_counter() - start)


def pipelined(db: Database, n: int, streams: int = 8) -> float:
    start = time.perf_counter()
    futures = [
        db.write(event_log.append_events, f"task_pipe{i}", [(seq, "response.output_text.delta", DATA % seq)])
        for seq in range(1, n + 1)
        for i in range(streams)
    ]
    for f in futures:
        f.result()
    return streams * n / (time.perf_counter() - start)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    results: dict[tuple[str, str], float] = {}
    for mode in ("FULL", "NORMAL"):
        with tempfile.TemporaryDirectory() as tmp, Database(Path(tmp) / "bench.sqlite3", synchronous=mode) as db:
            results[(mode, "one")] = one_stream(db, n)
            results[(mode, "threads")] = threaded_streams(db, n)
            results[(mode, "pipelined")] = pipelined(db, n)
            group = db.stats.largest_group
        print(
            f"synchronous={mode:6}  one stream {results[(mode, 'one')]:9.0f} ev/s   "
            f"8 threads {results[(mode, 'threads')]:9.0f} ev/s   "
            f"8 pipelined {results[(mode, 'pipelined')]:9.0f} ev/s   largest group {group}"
        )
    for shape in ("one", "threads", "pipelined"):
        print(f"NORMAL/FULL ratio, {shape:9}: {results[('NORMAL', shape)] / results[('FULL', shape)]:.2f}")
    print(
        f"group commit gain (FULL, 8 threads vs one stream): "
        f"{results[('FULL', 'threads')] / results[('FULL', 'one')]:.2f}x"
    )


if __name__ == "__main__":
    main()
