"""What the device tool would send to the GPU machine, and whether the device check runs there.

The GPU machine has its own Python with torch, transformers and numpy, no package index,
and takes at most 64 MiB of working tree (tracked files and untracked files git does not
ignore). This script
1. lists exactly those files, sums them and fails above the limit;
2. runs `python -m ssr.device_check --device cpu --arch tiny` from the checkout on a path that
   holds only torch, transformers, numpy and what they require (isolated: no site-packages),
   so anything else the check imports fails here first.

    python scripts/device_bundle.py [--limit-mib 64]

Then, on a machine with a GPU (the device tool's `run`), from the repository root:

    PYTHONPATH=src PYTHONUNBUFFERED=1 python3 -m ssr.device_check --out $OUT [--quick]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PACKAGES = ("torch", "transformers", "numpy")  # what the GPU machine's Python is known to hold


def travelling_files(root: Path = ROOT) -> list[tuple[str, int]]:
    """(path, bytes) of tracked files and untracked files git does not ignore."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, check=True, capture_output=True).stdout.decode()
    files = []
    for name in sorted(set(filter(None, listing.split("\0")))):
        path = root / name
        if path.is_file() and not path.is_symlink():
            files.append((name, path.stat().st_size))
    return files


def requirement_closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions these need, their requirements included (extras left out)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # optional on this platform (e.g. CUDA libraries on a CPU build)
        seen[name] = dist
        todo += [req for req in dist.requires or [] if "extra ==" not in req]
    return list(seen.values())


def top_level_entries(dist: metadata.Distribution) -> set[Path]:
    """The files and folders a distribution puts directly in site-packages (its metadata too:
    packages read their own version from it)."""
    entries = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first in ("..", "__pycache__") or first.endswith(".pth"):
            continue
        entries.add(Path(dist.locate_file(first)))
    return {entry for entry in entries if entry.exists()}


def isolated_run(out: Path) -> subprocess.CompletedProcess:
    """The CPU device check with only IMAGE_PACKAGES' closure importable."""
    dists = requirement_closure(IMAGE_PACKAGES)
    site = out / "site"
    site.mkdir(parents=True)
    for dist in dists:
        for entry in top_level_entries(dist):
            link = site / entry.name
            if not link.exists():
                link.symlink_to(entry)
    code = ("import sys, runpy; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; "
            "runpy.run_module('ssr.device_check', run_name='__main__', alter_sys=True)")
    command = [sys.executable, "-S", "-E", "-s", "-c", code, str(ROOT / "src"), str(site),
               "--device", "cpu", "--arch", "tiny", "--out", str(out / "check")]
    print(f"isolated path: {len(dists)} distributions ({', '.join(sorted(d.metadata['Name'] for d in dists))})")
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    return subprocess.run(command, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-mib", type=float, default=64.0)
    args = parser.parse_args(argv)
    files = travelling_files()
    total = sum(size for _, size in files)
    print(f"would send {len(files)} files, {total / 2**20:.2f} MiB (limit {args.limit_mib:g} MiB); largest:")
    for name, size in sorted(files, key=lambda item: -item[1])[:5]:
        print(f"  {size / 2**20:8.2f} MiB  {name}")
    if total > args.limit_mib * 2**20:
        print("too large for the device tool: ignore or remove the largest files", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="ssr-device-") as folder:
        run = isolated_run(Path(folder))
        print(run.stdout, end="")
        if run.returncode != 0:
            print(run.stderr[-4000:], file=sys.stderr)
            print(f"the device check failed with only {', '.join(IMAGE_PACKAGES)} importable "
                  f"(exit {run.returncode})", file=sys.stderr)
            return 1
    print(f"the device check runs with only {', '.join(IMAGE_PACKAGES)} (and their requirements) importable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
