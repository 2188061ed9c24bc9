"""What storing each instance's assembled text at write time would move: CPU on the read and the write side.

In one process, no database: a state of N instances (``bench.states.counted_state``) is parsed as a POST
parses it (``analyzer.state.parse_state``), its rows sorted in assembly order, and then timed (CPU, the
fastest of ``--reps``):

- today's assembly of those rows (``stream_state`` over UTF-8 instance texts, as the cursor gives them);
- the write side of a stored text: each instance's item text, as the assembly writes it, computed from the
  row's canonical text where the row is built (the cost a whole-state POST would gain);
- the read side of a stored text: the item texts joined into pieces and Go-escaped (what would be left of
  the assembly's Python work per instance).

Run: ``python -m bench.instance_text_bench --sizes 50000,200000``. Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable

from analyzer.state import ParsedState, parse_state
from analyzer.state_assembly import (
    _INSTANCE_INDENT,
    AssemblyRow,
    _Encoder,
    _go_escaped,
    row_order,
    stream_state,
)
from bench.states import counted_state

_PIECE_BYTES = 1 << 20


def _fastest(reps: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(reps):
        gc.collect()
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def measure(size: int, reps: int) -> dict[str, float]:
    body = counted_state(1, size)
    parsed = parse_state(body)
    assert isinstance(parsed, ParsedState)
    rows = [
        AssemblyRow(
            r.module, r.mode, r.type, r.name, r.address, r.index_key, r.deposed, r.provider, r.instance_json.encode()
        )
        for r in sorted(parsed.instances, key=row_order)
    ]

    def assemble() -> int:
        return sum(
            map(
                len,
                stream_state(
                    serial=1, lineage="l", terraform_version="1.11.0", instances=rows, outputs=(), plain_numbers=True
                ),
            )
        )

    # plain_numbers holds for canonical text when the body has no float written with an exponent.
    encoder = _Encoder(ensure_ascii=False, plain_numbers=True)
    texts: list[bytes] = []

    def write_side() -> None:
        texts[:] = [_INSTANCE_INDENT + encoder.instance(r).replace(b"\n", _INSTANCE_INDENT) for r in rows]

    def read_side() -> None:
        out = bytearray()
        for start in range(0, len(texts), 2000):
            out += b",".join(texts[start : start + 2000])
            if len(out) >= _PIECE_BYTES:
                _go_escaped(out)
                out = bytearray()
        _go_escaped(out)

    return {
        "state_mb": len(body) / 1e6,
        "parse": _fastest(reps, lambda: parse_state(body)),
        "assemble": _fastest(reps, assemble),
        "write_side": _fastest(reps, write_side),
        "read_side": _fastest(reps, read_side),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50000,200000")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| instances | body | parse_state (POST) | assembly today | item texts at write | stored texts joined |")
    print("|-----------|------|--------------------|----------------|---------------------|---------------------|")
    for size in (int(s) for s in args.sizes.split(",")):
        m = measure(size, args.reps)
        print(
            f"| {size:,} | {m['state_mb']:.0f} MB | {m['parse']:.2f} s | {m['assemble']:.2f} s | "
            f"{m['write_side']:.2f} s | {m['read_side']:.2f} s |"
        )
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
