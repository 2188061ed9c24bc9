"""The analyzer over real public configurations: parse agreement with ``terraform fmt``, crashes (must be 0)
and the outcome distribution of file-scoped footprints.

Point it at directories holding checked-out repositories (never committed here), for example:

    git clone --depth 1 https://github.com/terraform-aws-modules/terraform-aws-vpc /tmp/corpus/vpc   # and others
    .venv/bin/python -m bench.corpus_check /tmp/corpus            # prints the section
    .venv/bin/python -m bench.corpus_check /tmp/corpus --out docs/benchmarks.md

For every ``.tf`` file: does ``analyzer.hcl.analyze_file`` parse it, and does ``terraform fmt`` (the ``terraform``
on PATH, or ``--terraform``) accept it? For every directory with ``.tf`` files taken as a root module, and every
``.tf`` file of it as a one-file selection: the footprint's outcome — clean, widened (some ``widen``
diagnostic), failed closed (by construct), or a crash (an exception: must never happen).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import traceback
from collections import Counter
from pathlib import Path

from analyzer.footprint import compute_footprint
from analyzer.hcl import HclError, ParseCache, analyze_file
from bench.common import write_section

SECTION = "## Analyzer over public configurations"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--terraform", default=shutil.which("terraform") or "terraform")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    files = sorted(p for root in args.roots for p in root.rglob("*.tf") if ".terraform" not in p.parts)
    agree = disagree = 0
    disagreements: list[str] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        try:
            analyze_file(path.name, text)
            ours = True
        except HclError:
            ours = False
        fmt = subprocess.run([args.terraform, "fmt", "-write=false", "-list=false", "-no-color", str(path)],
                             capture_output=True, text=True, timeout=60)
        theirs = fmt.returncode == 0
        if ours == theirs:
            agree += 1
        else:
            disagree += 1
            disagreements.append(f"{path}: analyzer {'parses' if ours else 'rejects'}, terraform fmt "
                                 f"{'accepts' if theirs else 'rejects'}")
    outcomes: Counter[str] = Counter()
    constructs: Counter[str] = Counter()
    crashes: list[str] = []
    selections = 0
    for directory in sorted({p.parent for p in files}):
        texts = {p.name: p.read_text(encoding="utf-8", errors="surrogateescape")
                 for p in sorted(directory.iterdir()) if p.is_file() and p.name.endswith((".tf", ".tf.json"))}
        cache = ParseCache()
        for name in sorted(n for n in texts if n.endswith(".tf")):
            selections += 1
            try:
                fp = compute_footprint(texts, [name], cache=cache)
            except Exception:  # noqa: BLE001 - a crash is exactly what this counts
                crashes.append(f"{directory / name}: {traceback.format_exc(limit=3)}")
                outcomes["crash"] += 1
                continue
            if fp.fails_closed:
                outcomes["failed closed"] += 1
                constructs.update({d.construct for d in fp.diagnostics if d.action == "fail"})
            elif fp.diagnostics:
                outcomes["widened"] += 1
            else:
                outcomes["clean"] += 1
    lines = [SECTION, "",
             f"`.venv/bin/python -m bench.corpus_check ROOTS` over {len(args.roots)} root(s): {len(files)} `.tf` "
             f"files in {len({p.parent for p in files})} directories.", "",
             f"- parse agreement with `terraform fmt`: {agree} of {len(files)} files ({disagree} disagree)",
             f"- crashes: {outcomes['crash']}",
             f"- one-file selections: {selections} — " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
             ]
    if constructs:
        lines.append("- failed closed by construct: " + ", ".join(f"`{k}` {v}" for k, v in constructs.most_common()))
    lines.append("")
    section = "\n".join(lines)
    print(section)
    for line in disagreements[:20]:
        print("DISAGREE:", line, file=sys.stderr)
    for crash in crashes[:5]:
        print("CRASH:", crash, file=sys.stderr)
    if args.out is not None:
        write_section(args.out, SECTION, section)
    return 1 if crashes else 0


if __name__ == "__main__":
    raise SystemExit(main())
