"""Instructions per entry or occurrence, counted by valgrind's callgrind: client-side cost
that does not move with a noisy VM.

    python -m bench.instructions                      # this tree
    python -m bench.instructions --against ../other   # this tree beside another checkout
    python -m bench.instructions --out bench/runs/NAME  # NAME.md and NAME.json

On the shared 2-vCPU VMs this project runs on, the wall-clock rates of one code drift by
±20% between runs of the same command, more than most changes to a hot path. Callgrind
counts the instructions a process executes: the same count for the same code and inputs,
whatever else the machine does. Each workload (`bench/instructions_child.py`) runs twice
under callgrind, once building its inputs only (SETUP) and once doing its work as well
(WORK), and the difference, divided by N, is the work's own cost. Only the Python process is
counted: the pump's server runs outside valgrind, so its share of a drain is not in it. A
count is not a time (a cache miss costs more than an add), so the figures compare code with
code on one machine; `python -m bench.realistic` measures the time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = HERE / "instructions_child.py"
REPO = HERE.parent
# (workload, N, what one unit is): N keeps each run to a minute or so under callgrind.
WORKLOADS = (
    ("beat_schedule", 5_000, "entry converted (`app_schedule`)"),
    ("schedule_file", 5_000, "schedule-file entry validated (after the TOML parser)"),
    ("dramatiq_drain", 4_000, "occurrence a pump drains (pipelined Dramatiq, client side)"),
)
_COLLECTED = re.compile(r"Collected : (\d+)")


def count(tree: Path, workload: str, n: int, mode: str) -> int:
    """Instructions of one child run, with `tree`'s emq_bridge first on the path."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(CHILD),
            workload,
            str(n),
            mode,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(
            f"{workload} {mode} in {tree}: exit {done.returncode}: {done.stderr[-800:]}"
        )
    return int(found.group(1))


def per_unit(tree: Path, workload: str, n: int) -> int:
    return (count(tree, workload, n, "WORK") - count(tree, workload, n, "SETUP")) // n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, help="another checkout to count beside this one")
    parser.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench.instructions needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    trees = [("this tree", REPO)]
    if args.against is not None:
        trees.insert(0, ("--against", args.against.resolve()))
    rows = []
    for workload, n, unit in WORKLOADS:
        counts = {label: per_unit(tree, workload, n) for label, tree in trees}
        rows.append({"workload": workload, "n": n, "unit": unit, "instructions": counts})
        print(f"{workload}: {counts}", file=sys.stderr)
    lines = [
        "| instructions per unit | "
        + " | ".join(label for label, _ in trees)
        + " | this / against |"
    ]
    lines.append("|---|" + "--:|" * (len(trees) + 1))
    for row in rows:
        values = list(row["instructions"].values())
        ratio = f"{values[-1] / values[0]:.3f}x" if len(values) > 1 else ""
        cells = " | ".join(f"{v:,}" for v in values)
        lines.append(f"| {row['unit']}, N = {row['n']:,} | {cells} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.with_suffix(".md").write_text(table + "\n")
        args.out.with_suffix(".json").write_text(
            json.dumps({"trees": [label for label, _ in trees], "rows": rows}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
