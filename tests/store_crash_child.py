"""Child process of test_store_crash: a daemon-like store user under load, until SIGKILL.

On start it does what the daemon does after a crash: ends the tasks that
were running with a `response.failed` event (code `service_restarted`)
after their last event, and runs the queued ones. Then it queues one task
for the next life and runs producer threads that append events — some
awaited one by one, some pipelined so they share group commits — printing
``ack <task> <seq>`` only after the write's future resolved (the event is
committed). A reader thread checks that no log ever shows a gap.

Usage: ``store_crash_child.py DB SEED`` (runs until killed) or
``store_crash_child.py DB SEED --finish`` (recover, then exit cleanly).
"""

from __future__ import annotations

import random
import sys
import threading

from lmsp_tray.ids import new_id
from lmsp_tray.store import Database, event_log, task_rows


class Out:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def end_interrupted(db: Database, task_id: str) -> None:
    def fail(conn):  # one write: a second crash cannot leave two terminal events
        seq = event_log.last_event_seq(conn, task_id) + 1
        error = {"code": "service_restarted", "message": "the service restarted while this task ran"}
        data = {"type": "response.failed", "sequence_number": seq, "status": "failed", "error": error}
        return task_rows.finish(conn, task_id, "failed", error=error, events=[(seq, "response.failed", data)])

    db.write_sync(fail)


def run_queued(db: Database, task_id: str) -> None:
    if db.write_sync(task_rows.mark_in_progress, task_id) is None:
        return
    db.write_sync(event_log.append_events, task_id, [(1, "response.created", {"sequence_number": 1})])
    db.write_sync(
        task_rows.finish,
        task_id,
        "completed",
        response={"status": "completed"},
        events=[(2, "response.completed", {"sequence_number": 2})],
    )


def recover(db: Database, out: Out) -> None:
    found = db.write_sync(task_rows.recover_after_crash)
    for task in found.interrupted:
        end_interrupted(db, task.id)
        out(f"failed {task.id}")
    for task in found.queued:
        run_queued(db, task.id)
        out(f"ran {task.id}")


def producer(db: Database, rnd: random.Random, out: Out) -> None:
    while True:
        tid = new_id("task")
        db.write_sync(task_rows.create, tid, {"model": "tiny", "input": "x"})
        db.write_sync(task_rows.mark_in_progress, tid, response_id=new_id("resp"))
        out(f"started {tid}")
        total = rnd.randint(5, 80)
        seq = 1
        while seq <= total:
            chunk = min(rnd.randint(1, 6), total - seq + 1)
            futures = [
                db.write(
                    event_log.append_events,
                    tid,
                    [(s, "response.output_text.delta", {"sequence_number": s, "delta": "y" * rnd.randint(0, 400)})],
                )
                for s in range(seq, seq + chunk)
            ]
            for s, fut in zip(range(seq, seq + chunk), futures):
                fut.result()
                out(f"ack {tid} {s}")
            seq += chunk
        db.write_sync(
            task_rows.finish,
            tid,
            "completed",
            response={"status": "completed"},
            events=[(seq, "response.completed", {"sequence_number": seq})],
        )
        out(f"done {tid} {seq}")


def checker(db: Database, out: Out) -> None:
    while True:
        owners = db.read(
            lambda c: [r[0] for r in c.execute("SELECT owner_id FROM event_logs ORDER BY random() LIMIT 5")]
        )
        for owner in owners:
            seqs = [e.seq for e in db.read(event_log.read_events, owner)]
            if seqs != list(range(1, len(seqs) + 1)):
                out(f"BAD gap in {owner}: {seqs[:20]}")


def main(argv: list[str]) -> None:
    path, seed = argv[0], int(argv[1])
    out = Out()
    db = Database(path)
    recover(db, out)
    if "--finish" in argv:
        db.close()
        out("finished")
        return
    queued = new_id("task")
    db.write_sync(task_rows.create, queued, {"model": "tiny", "input": "later"})
    out(f"queued {queued}")
    out("ready")
    rnd = random.Random(seed)
    threads = [
        threading.Thread(target=producer, args=(db, random.Random(rnd.random()), out), daemon=True) for _ in range(4)
    ]
    threads.append(threading.Thread(target=checker, args=(db, out), daemon=True))
    for th in threads:
        th.start()
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main(sys.argv[1:])
