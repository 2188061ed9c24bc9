"""16 threads × 200 random acquire/release cycles over overlapping globs on one state; at no
moment may two live, conflicting reservations coexist — checked from the table under snapshots
and from the grants the clients saw."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import psycopg

from analyzer.globs import conflicts, parse_glob
from app.domain.principal import default_principal
from app.domain.reservations import parse_wanted
from app.errors import ReservationConflictError
from app.store import Database, runs

GLOBS = ["*", "module.web.*", 'module.web["a"].*', "module.web.x.y", "module.db.*", "module.db.x.y",
         "aws_vpc.main", "aws_vpc.main.*", "aws_vpc.other", "module.webapp.*"]
THREADS, CYCLES = 16, 200


def _conflicting(a: tuple[str, str], b: tuple[str, str]) -> bool:
    return conflicts(a[1], parse_glob(a[0]), b[1], parse_glob(b[0]))


def test_no_two_conflicting_reservations_are_ever_live_together(clean_db):
    db = Database(clean_db, pool_size=THREADS + 2)
    who = default_principal("stress")
    grants: list[tuple[float, float, tuple[tuple[str, str], ...]]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    violations: list[str] = []
    snapshots = [0]

    def checker() -> None:
        with psycopg.connect(clean_db, autocommit=True) as conn:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    rows = conn.execute(
                        "SELECT run_id, glob, mode FROM resource_reservations WHERE expires_at > now()").fetchall()
                snapshots[0] += 1
                for i, (run_a, glob_a, mode_a) in enumerate(rows):
                    for run_b, glob_b, mode_b in rows[i + 1:]:
                        if run_a != run_b and _conflicting((glob_a, mode_a), (glob_b, mode_b)):
                            violations.append(f"{run_a} {mode_a} {glob_a} vs {run_b} {mode_b} {glob_b}")

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(CYCLES):
                wanted = tuple({(rng.choice(GLOBS), rng.choice(["read", "read", "write"]))
                                for _ in range(rng.randint(1, 3))})
                try:
                    run = runs.open_run(db, who, "hot", actor=f"w{seed}", wanted=parse_wanted(wanted),
                                        lease=timedelta(minutes=5))
                except ReservationConflictError:
                    continue
                granted = time.monotonic()
                time.sleep(rng.random() * 0.002)
                released = time.monotonic()
                runs.release(db, who, run.id, holder=f"w{seed}")
                grants.append((granted, released, wanted))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    watcher = threading.Thread(target=checker)
    watcher.start()
    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    watcher.join()
    db.close()

    assert not errors, errors[:3]
    assert not violations, violations[:5]
    assert snapshots[0] > 10
    assert len(grants) > THREADS * CYCLES // 10, "too few grants to mean anything"
    grants.sort()
    for i, (_, end_a, wanted_a) in enumerate(grants):
        for start_b, _, wanted_b in grants[i + 1:]:
            if start_b >= end_a:
                break
            assert not any(_conflicting(a, b) for a in wanted_a for b in wanted_b), (wanted_a, wanted_b)
