"""The README's first example, as a newcomer runs it: the default model answers with a
correct function (executed on a handful of inputs), the reasoning and one stats line."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ssr.bench.functions import FUNCTIONS, run_cases
from ssr.bench.scoring import code_block
from ssr.models import DEFAULT_MODEL

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_first_command() -> list[str]:
    """The `ssr generate ...` of the README's first command block."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL).group(1)
    command = block[block.index("ssr generate"):].splitlines()[0]
    return shlex.split(command)[1:]


def test_readme_first_command_is_the_prime_example():
    argv = readme_first_command()
    assert argv[0] == "generate" and argv[1] == FUNCTIONS[0][1]  # the prompt checked below
    assert "--model" not in argv  # it runs the default model


@pytest.mark.slow
@pytest.mark.model
def test_readme_first_example_answers_correctly():
    argv = readme_first_command()
    done = subprocess.run([sys.executable, "-m", "ssr.cli", *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    code = code_block(done.stdout)
    outcome = run_cases(code, FUNCTIONS[0][2])
    assert outcome["passed"] == outcome["cases"], (outcome, done.stdout)
    assert done.stdout.rstrip().endswith("```")  # the answer ended at its closing fence
    stats = done.stderr.strip().splitlines()
    if stats and stats[0].startswith("measuring engine costs once"):  # a machine's first run measures its engine
        stats = stats[1:]
    assert len(stats) == 1 and re.match(r"[\d.]+ s: thought \d+ tokens", stats[0]), done.stderr
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"  # the model the README and docs/first-run.md name
