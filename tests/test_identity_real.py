"""Lossless, tested: SSR equals plain decoding token for token under greedy, real weights.

A divergence fails unless it is a near tie (the two tokens' logits within
NEAR_TIE of each other), which is reported with its logit gap: batched and
single-token passes round differently, so exact ties can flip.
"""
import pytest

from ssr import SSR, GenerationConfig
from ssr.verifying.lossless import first_divergence

from prompts import classeval_prompts, humaneval_prompts

pytestmark = pytest.mark.model  # loads real model weights or starts ssr processes (deselect: -m 'not model')

NEAR_TIE = 0.1  # logits; llama.cpp's batched vs single-token rounding differences are far smaller


@pytest.fixture(scope="module")
def smollm():
    return SSR("smollm2-135m", context_size=4096)


def check_identity(model, prompt, report, **budgets):
    budgets.setdefault("policy", "fixed")  # drafts forked as asked, whatever they would cost here
    ar = model.generate(prompt, GenerationConfig(mode="ar", **budgets))
    ssr = model.generate(prompt, GenerationConfig(mode="ssr", **budgets))
    assert model.engine.live_sequences() == 0
    divergence = first_divergence(model.engine, model.prompt_ids(prompt), ar, ssr)
    if divergence is not None:
        report.append(divergence.describe())
        assert divergence.logit_gap <= NEAR_TIE, divergence.describe()
    return ar, ssr


SMOL_PROMPTS = humaneval_prompts(16) + classeval_prompts(4)


@pytest.mark.parametrize("index", range(len(SMOL_PROMPTS)))
def test_smollm_greedy_identity(smollm, index, record_property):
    report = []
    interval = 20 if index % 2 else 0  # odd items: multi-stage, forks at 32, 52, 72, 92
    ar, ssr = check_identity(smollm, SMOL_PROMPTS[index], report, thinking_budget=96,
                             draft_at=32, draft_tokens=64, max_answer_tokens=96, draft_interval=interval)
    record_property("divergence", report)
    m = ssr.metrics
    if m.cot_tokens > 32:  # the CoT reached b_d: a draft was written and verified
        assert m.draft_tokens > 0 and m.verify_passes >= 1
    if interval and m.cot_tokens > 52:
        assert len(m.stages) >= 2
    print(f"[{index}] accepted prefix {m.accepted_prefix_tokens}, suffix {m.answer_accepted_tokens}"
          f"/{m.answer_proposed_tokens}; {report or 'identical'}")


@pytest.mark.parametrize("mode", ["ssr-prefix", "ssr-suffix", "suffix", "pld"])
def test_smollm_other_modes_identity(smollm, mode):
    prompt = SMOL_PROMPTS[0]
    budgets = dict(thinking_budget=64, draft_at=16, draft_tokens=48, max_answer_tokens=64, policy="fixed")
    ar = smollm.generate(prompt, GenerationConfig(mode="ar", **budgets))
    got = smollm.generate(prompt, GenerationConfig(mode=mode, **budgets))
    divergence = first_divergence(smollm.engine, smollm.prompt_ids(prompt), ar, got)
    assert divergence is None or divergence.logit_gap <= NEAR_TIE, divergence.describe()


@pytest.fixture(scope="module")
def smollm_transformers():
    pytest.importorskip("transformers", reason="the transformers engine needs  pip install -e '.[torch]'")
    return SSR("smollm2-135m", engine="transformers", context_size=4096)


@pytest.mark.parametrize("index", range(6))
def test_smollm_transformers_greedy_identity(smollm_transformers, index):
    """The same check on the transformers engine (float32, GGUF weights dequantized)."""
    report = []
    _, ssr = check_identity(smollm_transformers, SMOL_PROMPTS[index * 3], report, thinking_budget=96,
                            draft_at=32, draft_tokens=64, max_answer_tokens=96)
    m = ssr.metrics
    print(f"[{index}] accepted prefix {m.accepted_prefix_tokens}, suffix {m.answer_accepted_tokens}"
          f"/{m.answer_proposed_tokens}; {report or 'identical'}")


QWEN_PROMPTS = classeval_prompts(3, start=10) or humaneval_prompts(3)


@pytest.fixture(scope="module")
def qwen():
    return SSR("qwen2.5-coder-0.5b", context_size=4096)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(QWEN_PROMPTS)))
def test_qwen_greedy_identity(qwen, index):
    report = []
    ar, ssr = check_identity(qwen, QWEN_PROMPTS[index], report, thinking_budget=192,
                             draft_at=64, draft_tokens=128, max_answer_tokens=160)
    m = ssr.metrics
    print(f"[{index}] accepted prefix {m.accepted_prefix_tokens}, suffix {m.answer_accepted_tokens}"
          f"/{m.answer_proposed_tokens}; {report or 'identical'}")


def gpu_priced(model, prompt, mode, **budgets):
    """A request on `model`'s engine priced with the GPU preset: verifying ~free, so CoT spans go
    on beside the draft child in shared passes and several candidate spans are verified per pass,
    each on its own fork of the parent (real forks and one-pass batches on the real engine)."""
    from ssr.pricing.costs import CostModel, gpu_preset
    from ssr.loop import Generation

    fmt = model.format()
    config = GenerationConfig(mode=mode, policy="fixed", **budgets)
    return Generation(model.engine, fmt, config, model.prompt_ids(prompt), model.banned_ids(fmt),
                      costs=CostModel(table=gpu_preset())).run()


@pytest.mark.parametrize("engine_name", ["llama.cpp", "transformers"])
def test_branches_and_shared_passes_keep_greedy_identity(smollm, engine_name, request):
    model = smollm if engine_name == "llama.cpp" else request.getfixturevalue("smollm_transformers")
    budgets = dict(thinking_budget=96, draft_at=24, draft_tokens=64, max_answer_tokens=96)
    branched = shared = 0
    for prompt in SMOL_PROMPTS[:6] if engine_name == "llama.cpp" else SMOL_PROMPTS[:2]:
        ar = gpu_priced(model, prompt, "ar", **budgets)
        got = gpu_priced(model, prompt, "ssr", **budgets)
        assert model.engine.live_sequences() == 0
        divergence = first_divergence(model.engine, model.prompt_ids(prompt), ar, got)
        assert divergence is None or divergence.logit_gap <= NEAR_TIE, divergence.describe()
        branched += got.metrics.branch_passes
        shared += got.metrics.shared_passes
    assert branched > 0 and shared > 0  # both paths ran on the real engine
