"""Whether two `ssr traces --out` folders hold the same replays, row for row, host time aside: the
check that a change of the loop changed no token, no pass and no modelled second.

    git worktree add /tmp/before OLD && (cd /tmp/before && PYTHONPATH=src ssr traces FILES --limit 3 --out /tmp/a)
    ssr traces FILES --limit 3 --out /tmp/b
    python scripts/same_replays.py /tmp/a /tmp/b

Prints the rows compared and the first differences (row, field); exits 1 when any."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HOST_FIELDS = ("host",)  # the loop's measured host time: it differs from run to run
HOST_METRICS = ("host_s",)


def rows(folder: Path) -> list[dict]:
    from ssr.metrics import current_names  # rows from before a metric's rename compare under today's name

    out = []
    for line in (folder / "rows.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        row["metrics"] = current_names(row.get("metrics", {}))
        for field in HOST_FIELDS:
            row.pop(field, None)
        for field in HOST_METRICS:
            row.get("metrics", {}).pop(field, None)
        out.append(row)
    return out


def differences(before: list[dict], after: list[dict]) -> list[tuple[int, str]]:
    found = [(-1, f"{len(before)} rows before, {len(after)} after")] if len(before) != len(after) else []
    for index, (old, new) in enumerate(zip(before, after)):
        for field in sorted(set(old) | set(new)):
            if old.get(field) != new.get(field):
                found.append((index, field))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="an `ssr traces --out` folder")
    parser.add_argument("after", type=Path, help="another, replayed with the same flags")
    args = parser.parse_args(argv)
    before, after = rows(args.before), rows(args.after)
    found = differences(before, after)
    print(f"{len(before)} rows: " + ("identical, host time aside" if not found else f"{len(found)} differences"))
    for index, field in found[:10]:
        print(f"  row {index}: {field}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
