"""The private vLLM surfaces ssr's drafter uses (engines/vllm_surface.py), checked on the installed
vLLM's source (this fails on a vLLM that changed one), and the checker itself on hand-built trees."""
from pathlib import Path

import pytest

from ssr.engines import vllm_surface
from ssr.engines.vllm_surface import SURFACES, check, installed_vllm


@pytest.mark.vllm
def test_the_installed_vllm_has_every_surface_ssr_uses():
    vllm_dir = installed_vllm()
    if vllm_dir is None:
        pytest.skip("no vLLM installed (the vLLM environment's test command runs this)")
    missing = [f"{f.surface.name}: {f.why}" for f in check(vllm_dir) if not f.ok]
    assert not missing, f"vLLM {vllm_surface.version_of(vllm_dir)} changed what ssr uses:\n" + "\n".join(missing)


def _tree(tmp_path: Path, drop: str | None = None, edit: tuple[str, str, str] | None = None) -> Path:
    """A vllm folder with, per surface file, text that matches every pattern on it (built from
    the source each pattern was written against: a minimal line for each)."""
    texts = {
        "config/speculative.py": 'SpeculativeMethod = Literal[\n    "ngram",\n    "custom_class",\n    EagleModelTypes,\n]\n',
        "v1/spec_decode/custom_class_proposer.py": "    instance = user_class(vllm_config)\n",
        "config/vllm.py": 'def _get_v2_model_runner_unsupported_features(self):\n    if m in ("suffix", "custom_class"):\n',
        "engine/arg_utils.py": ("def create_speculative_config(\n    self,\n    target_model_config: ModelConfig,\n):\n"
                                "    return SpeculativeConfig(**self.speculative_config)\n"),
        "v1/worker/gpu_model_runner.py": (
            "self.drafter = create_custom_proposer(self.vllm_config)\nself.input_batch = InputBatch(\n"
            "def propose_draft_token_ids(\n    elif spec_config.method == \"custom_class\":\n"
            "        ids = cast(Any, self.drafter).propose(\n            sampled_token_ids,\n"
            "            self.input_batch.num_tokens_no_spec,\n            self.input_batch.token_ids_cpu,\n"
            "            slot_mappings=slot_mappings,\n"),
        "v1/worker/cpu_model_runner.py": "class CPUModelRunner(GPUModelRunner):\n",
        "v1/worker/gpu_input_batch.py": ("self.num_prompt_tokens = x\nself.req_id_to_index: dict[str, int] = {}\n"
                                         "def req_ids(self) -> list[str]:\n"),
        "v1/engine/output_processor.py": "    def get_num_unfinished_requests(self):\n",
        "config/model.py": "    def is_hybrid(self) -> bool:\n",
    }
    root = tmp_path / "vllm"
    for name, text in texts.items():
        if name == drop:
            continue
        if edit and edit[0] == name:
            text = text.replace(edit[1], edit[2])
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "__init__.py").write_text("")
    (root / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    return root


def test_the_checker_passes_a_tree_that_has_everything(tmp_path, capsys):
    assert {s.file for s in SURFACES} <= {str(p.relative_to(tmp_path / "vllm")) for p in _tree(tmp_path).rglob("*.py")}
    assert all(f.ok for f in check(tmp_path / "vllm"))
    assert vllm_surface.main([str(tmp_path / "vllm")]) == 0
    assert "vLLM 9.9.9" in capsys.readouterr().out


@pytest.mark.parametrize("drop, edit, gone", [
    ("v1/spec_decode/custom_class_proposer.py", None, "custom_class builds"),  # the hook removed (vLLM 0.34.0)
    (None, ("config/speculative.py", '"custom_class",', ""), "method takes 'custom_class'"),
    (None, ("v1/worker/gpu_model_runner.py", "self.input_batch.token_ids_cpu,", "self.input_batch.token_ids,"),
     "calls a custom drafter's propose"),  # the call's arguments changed
    (None, ("v1/worker/gpu_input_batch.py", "def req_ids", "def request_ids"), "InputBatch.req_ids"),
    ("v1/worker/cpu_model_runner.py", None, "CPUModelRunner"),
])
def test_the_checker_names_what_changed(tmp_path, capsys, drop, edit, gone):
    findings = check(_tree(tmp_path, drop, edit))
    assert [f.surface.name for f in findings if not f.ok] == [s.name for s in SURFACES if gone in s.name]
    assert vllm_surface.main([str(tmp_path / "vllm")]) == 1
    assert "GONE" in capsys.readouterr().out


def test_no_vllm_folder_is_a_clear_error(tmp_path, capsys):
    assert vllm_surface.main([str(tmp_path)]) == 2
    assert "no vLLM here" in capsys.readouterr().err
