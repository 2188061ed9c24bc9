"""Differential equivalence of file-scoped applies at scale: runs the seeded cases of bench/differential.py
(random multi-file configurations and random edits, applied through ``kl apply -f … --confirm-scope`` /
``--changed-from HEAD`` and through vanilla ``terraform apply`` on a second state) and counts how many
converged, were refused with nothing written, or diverged (which must be 0). The cases hold real objects of
the fakecloud provider (built into a filesystem mirror first) and edit them too — deletions, ``removed``
blocks, removed outputs, module moves, data sources — unless ``--plain``.

Run from the repository root:

    .venv/bin/python -m bench.differential_bench --cases 200          # rewrites its section of docs/benchmarks.md
    .venv/bin/python -m bench.differential_bench --quick              # 10 cases; prints only
    .venv/bin/python -m bench.differential_bench --first-seed 1000    # another range of seeds
    .venv/bin/python -m bench.differential_bench --plain              # terraform_data only, no provider

Exit status 1 when any case diverged (its seed, edits and the difference are printed: re-run that one seed
with ``--first-seed N --cases 1``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from bench import common
from bench.backend_bench import Harness
from bench.common import table
from bench.differential import Case, cleanup
from bench.fakecloud.install import install

SECTION = "## Differential equivalence of file-scoped applies"
KINDS = "; real fakecloud objects: deletions, removed blocks and outputs, module moves, data sources, deleted files"
VENV_BIN = Path(sys.executable).parent


def main(argv: list[str] | None = None) -> int:
    parser = common.bench_parser("differential_bench", __doc__ or "", quick_help="10 cases, section printed only",
                          section=SECTION)
    parser.add_argument("--cases", type=int, default=200, help="how many seeds to run (default: %(default)s)")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed (default: %(default)s)")
    parser.add_argument("--plain", action="store_true", help="no real objects: terraform_data only")
    args = parser.parse_args(argv)
    common.stop_cleanly_on_signals()
    cases = 10 if args.quick else args.cases
    counts: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    diverged: list[str] = []
    started = time.perf_counter()
    with Harness(args.database_url) as h, tempfile.TemporaryDirectory(prefix="kl-diff-") as tmp:
        rc = Path(tmp) / "terraformrc"
        rc.write_text("")
        (Path(tmp) / "plugins").mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KL_", "TF_"))}
        env.update(TF_CLI_CONFIG_FILE=str(rc), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1", NO_COLOR="1",
                   KL_TERRAFORM_BIN=str(VENV_BIN / "kl-terraform"), KL_DATA_DIR=str(Path(tmp) / "kl-data"))
        cloud = None if args.plain else install(Path(tmp) / "fakecloud")
        for seed in range(args.first_seed, args.first_seed + cases):
            root = Path(tmp) / f"case-{seed}"
            case = Case(seed, root, f"{h.base}/v1/states/diff-{seed}", env, str(VENV_BIN / "kl"),
                        str(VENV_BIN / "kl-terraform"), cloud=cloud)
            try:
                outcome = case.run()
            finally:
                cleanup(root)
            counts[outcome.result] += 1
            if outcome.result == "refused":
                refusals[_reason(outcome.detail)] += 1
            if outcome.result == "diverged":
                diverged.append(f"seed {seed} ({outcome.mode}; edits {', '.join(outcome.edits)}): {outcome.detail}")
            print(f"seed {seed}: {outcome.result} ({outcome.mode}; {', '.join(outcome.edits)})", flush=True)
    elapsed = time.perf_counter() - started
    section = render(counts, refusals, cases, args.first_seed, elapsed, common.machine_info(args.database_url),
                     plain=args.plain)
    print(section)
    for line in diverged:
        print("DIVERGED:", line, file=sys.stderr)
    out = common.out_path(args)
    if out is not None:
        common.write_section(out, SECTION, section)
    return 1 if diverged else 0


def _reason(detail: str) -> str:
    for construct in ("tf_json", "parse_error", "invalid_label", "provider_consumer", "undefined_reference",
                      "outside the file-scoped footprint", "changed since", "held by"):
        if construct in detail:
            return construct
    return detail.splitlines()[0][:80] if detail else "(no message)"


def render(counts: Counter[str], refusals: Counter[str], cases: int, first: int, elapsed: float,
           machine: list[tuple[str, str]], plain: bool = False) -> str:
    rows = [[str(cases), str(counts["converged"]), str(counts["refused"]), str(counts["diverged"]),
             f"{elapsed / max(cases, 1):.1f} s"]]
    lines = [SECTION, "",
             f"Measured {datetime.now(UTC).strftime('%Y-%m-%d')} with `.venv/bin/python -m bench.differential_bench "
             f"--cases {cases} --first-seed {first}{' --plain' if plain else ''}` (seeds {first}–{first + cases - 1}"
             f"{'' if plain else KINDS}).", "",
             table(["cases run", "converged", "refused (exit 2/3, nothing written)", "diverged", "per case"], rows),
             ""]
    if refusals:
        lines += ["Refusals by reason:", ""]
        lines += [f"- {reason}: {n}" for reason, n in refusals.most_common()]
        lines.append("")
    lines += ["Machine: " + "; ".join(f"{k} {v}" for k, v in machine), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
