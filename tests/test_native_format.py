"""The model's own output by default: in a reasoning model's own format ssr adds nothing to what
the engine decodes plainly (no thinking budget, nothing forced after the end marker, an EOS in the
CoT ends the output, max_tokens counting the reasoning too, no repetition stop).

The oracle is the engine itself, stepped greedily one token at a time with no ssr code in between.
The fake engine's part runs in the fast loop; the real one (SmolLM2's weights behind a chat
template that opens `<think>`, against llama-cpp-python's own `Llama.create_completion`) is a model
test."""
import numpy as np
import pytest

from ssr import SSR, GenerationConfig
from ssr.api import for_format, open_thinking
from ssr.config import MODES
from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import FORMATS, TEMPLATE_BUDGET, detect_format
from ssr.loop import Generation

THINK = FORMATS["think"]
# QwQ's and DeepSeek-R1's shape: the generation prompt opens the CoT itself
OPENS_THINKING = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
# Qwen3's shape: the model writes <think> itself (ssr opens it in the prompt)
MENTIONS_THINKING = OPENS_THINKING.replace("<think>\n", "") + "{# <think> #}"


def plain_greedy(engine, prompt_ids, limit):
    """The engine alone: prefill, then one argmax step at a time until EOS or `limit` tokens
    (the EOS kept, as llama.cpp and vLLM return it)."""
    seq = engine.prefill(prompt_ids[:-1])
    out, token = [], prompt_ids[-1]
    while len(out) < limit:
        token = int(np.argmax(engine.step([(seq, token)])[0]))
        out.append(token)
        if token in engine.eos_ids:
            break
    engine.release(seq)
    return out


def output_with_eos(result, eos):
    """What the request wrote, as the engine alone returns it: an EOS that ended it is kept."""
    return result.output_ids + ([eos] if result.metrics.stop == "eos" else [])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eos_bias,limit", [(0.0, 90), (2.0, 400)])  # the limit ends it; an EOS at 397
def test_native_format_writes_what_the_engine_writes_alone(mode, eos_bias, limit):
    """No budget, nothing forced: the CoT runs to the output's limit (cot_end "length": no answer)
    or to an EOS, which ends the output (stop "eos"); the tokens are the engine's own."""
    engine = FakeEngine(eos_bias=eos_bias)
    prompt = engine.tokenize("def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n<think>\n")
    want = plain_greedy(engine, prompt, limit)
    config = GenerationConfig(mode=mode, max_tokens=limit, policy="fixed", draft_at=8, draft_tokens=16,
                              adaptive_spans=False)  # every span verified, up to the limit and the EOS
    result = Generation(engine, THINK, config, prompt).run()
    assert output_with_eos(result, 0) == want
    assert result.forced_ids == [] and result.metrics.forced_tokens == 0
    assert engine.live_sequences() == 0
    if len(want) == limit and want[-1] != 0:  # the limit ended it
        assert result.metrics.cot_end == "length" and result.metrics.stop == "max_tokens"
    else:
        assert result.metrics.cot_end == "eos" and result.metrics.stop == "eos"
    if mode != "ar" and mode != "ssr-prefix" and mode != "ngram":  # spans were verified in the CoT
        assert result.metrics.cot_passes > 0


class EndsThinkingEngine(FakeEngine):
    """Writes the end marker itself, `after` tokens into its output, then goes on as the fake model."""

    def __init__(self, prompt_len: int, after: int, marker: str = "</think>", **options) -> None:
        super().__init__(**options)
        self.prompt_len, self.after, self.marker = prompt_len, after, marker

    def _logits(self, tokens):
        logits = super()._logits(tokens)
        at = len(tokens) - self.prompt_len - self.after  # tokens[-1] is the output's (at + after)-th
        if 0 <= at < len(self.marker):
            logits[ord(self.marker[at])] = 100.0
        return logits


@pytest.mark.parametrize("mode", MODES)
def test_after_its_own_end_marker_a_native_model_answers_unforced(mode):
    """The model closes its thinking itself: nothing is forced after the marker, the answer is the
    engine's next tokens, and a draft child (forked before the marker) is verified against them."""
    prompt = FakeEngine().tokenize("def add(a, b):\n    return a + b\n<think>\n")
    engine = EndsThinkingEngine(len(prompt), after=40)
    want = plain_greedy(engine, prompt, 300)
    config = GenerationConfig(mode=mode, max_tokens=300, policy="fixed", draft_at=16, draft_tokens=24,
                              adaptive_spans=False)
    result = Generation(engine, THINK, config, prompt).run()
    assert result.metrics.cot_end == "natural" and result.forced_ids == []
    assert "".join(map(chr, result.cot_ids)).endswith("</think>") and len(result.cot_ids) == 48
    assert result.answer_ids and output_with_eos(result, 0) == want
    if config.uses_draft:
        assert result.metrics.draft_tokens > 0 and result.metrics.stages


def test_eos_in_the_cot_ends_a_native_output_but_a_template_answers():
    engine = FakeEngine(eos_bias=4.0)  # an EOS 37 tokens into the CoT
    prompt = engine.tokenize("x = [1, 2, 3]\n<think>\n")
    native = Generation(engine, THINK, GenerationConfig(mode="ar", max_tokens=3000), prompt).run()
    assert native.metrics.cot_end == "eos" and native.metrics.stop == "eos" and native.answer_ids == []
    templated = Generation(engine, FORMATS["plain"], GenerationConfig(mode="ar", max_tokens=3000,
                                                                       thinking_budget=3000), prompt).run()
    assert templated.metrics.cot_end == "eos" and templated.forced_ids and templated.answer_ids


def test_max_tokens_counts_the_reasoning_and_max_answer_tokens_the_answer_only():
    engine = FakeEngine()
    prompt = engine.tokenize("def f(x):\n<think>\n")
    both = GenerationConfig(mode="ssr", thinking_budget=30, max_tokens=50, policy="fixed", draft_at=8)
    result = Generation(engine, FORMATS["plain"], both, prompt).run()
    assert len(result.output_ids) == 50 and result.metrics.stop == "max_tokens"
    answer_only = GenerationConfig(mode="ssr", thinking_budget=30, max_answer_tokens=12, policy="fixed", draft_at=8)
    result = Generation(engine, FORMATS["plain"], answer_only, prompt).run()
    assert len(result.answer_ids) == 12 and len(result.cot_ids) == 30 and result.metrics.stop == "max_tokens"


def test_a_template_keeps_its_budget_and_a_request_sets_its_own():
    assert FORMATS["code"].budget == FORMATS["plain"].budget == TEMPLATE_BUDGET
    assert THINK.budget is None and THINK.native and THINK.answer_prefix == ""
    assert for_format(GenerationConfig(), FORMATS["code"]).thinking_budget == TEMPLATE_BUDGET
    assert for_format(GenerationConfig(), THINK).thinking_budget is None
    assert for_format(GenerationConfig(thinking_budget=300), FORMATS["code"]).thinking_budget == 300
    assert for_format(GenerationConfig(thinking_budget=300), FORMATS["none"]).thinking_budget == 0
    small = for_format(GenerationConfig(), FORMATS["code"].__class__(**{**FORMATS["code"].__dict__, "budget": 40}))
    assert small.thinking_budget == 40 and small.draft_at < 40  # the fork point follows a template's small budget


def test_defaults_change_nothing():
    config = GenerationConfig()
    assert config.thinking_budget is None and config.max_tokens is None and config.max_answer_tokens is None
    assert config.repetition_stop == 0


@pytest.mark.parametrize("template,opened", [(OPENS_THINKING, True), (MENTIONS_THINKING, False)])
def test_the_prompt_is_the_templates_own_where_it_opens_the_cot(template, opened):
    assert detect_format(template) is THINK
    engine = FakeEngine()
    engine.chat_template = template
    model = SSR(engine=engine)
    text = "".join(chr(t) for t in model.prompt_ids("hi"))
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    assert text.count("<think>") == 1  # never twice (opened: by the template; else by ssr)
    assert open_thinking("a<think>\n", "<think>\n") == "a<think>\n"
    assert open_thinking("a<think>", "<think>\n") == "a<think>"
    assert open_thinking("a", "<think>\n") == "a<think>\n"


# -- real weights: ssr's defaults against llama.cpp alone --------------------------------------

SMOL_CONTEXT = 640  # small enough that a CoT which never ends reaches the context's end in seconds
REAL_PROMPTS = [  # the first ends with an EOS in its CoT (110 tokens), the second at the context's end
    "Write a Python function that checks whether a number is prime.",
    "Write a Python class for a bank account with deposit, withdraw, balance, transfer, history and interest "
    "methods, each with a docstring and tests."]


@pytest.fixture(scope="module")
def thinking_smollm():
    """SmolLM2's weights behind a chat template that opens <think>: a reasoning model's format."""
    from ssr.engines.llamacpp import LlamaCppEngine
    from ssr.models import resolve_model

    engine = LlamaCppEngine(resolve_model("smollm2-135m"), context_size=SMOL_CONTEXT)
    engine.chat_template = OPENS_THINKING
    model = SSR(engine=engine)
    yield model
    engine.close()


def llama_alone(model_path, prompt_ids, context):
    """llama-cpp-python's own Llama, greedy, with ssr's engine settings (flash attention, K cache
    in q8_0: docs/losslessness.md) and no limit but the context, as its create_completion
    reads max_tokens=None: the tokens it samples, the EOS included."""
    import os

    import llama_cpp

    llm = llama_cpp.Llama(str(model_path), n_ctx=context, n_batch=512, n_ubatch=512, flash_attn=True,
                          type_k=8, type_v=1, n_threads=os.cpu_count(), n_threads_batch=os.cpu_count(),
                          verbose=False)
    out, room = [], context - len(prompt_ids)
    for token in llm.generate(prompt_ids, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, token) or len(out) >= room:
            break
    llm.close()
    return out


@pytest.mark.model
@pytest.mark.parametrize("prompt", REAL_PROMPTS)
def test_real_native_format_equals_llama_cpp_alone(thinking_smollm, prompt):
    model = thinking_smollm
    prompt_ids = model.prompt_ids(prompt)
    assert model.format().native
    want = llama_alone(model.engine.model_path, prompt_ids, model.engine.context_size)  # (rounded up by llama.cpp)
    for config in (GenerationConfig(mode="ar"), GenerationConfig(),  # the defaults: ssr, --policy auto
                   GenerationConfig(policy="fixed", draft_at=48, draft_tokens=64, adaptive_spans=False)):
        result = model.generate(prompt, config)
        ended = result.metrics.stop == "eos"  # the EOS that ended it is not in output_ids
        assert result.output_ids == want[: len(want) - ended], (config.mode, config.policy, len(want))
        assert ended == (want[-1] in model.engine.eos_ids)
        assert ended or len(prompt_ids) + len(want) == model.engine.context_size
        assert result.forced_ids == []
        assert model.engine.live_sequences() == 0


@pytest.mark.parametrize("chat_template, flag, suite, expected", [
    ("{{ '<|im_start|>assistant\\n<think>\\n' }}", "auto", "humaneval", "auto"),  # its own format: as served
    ("{{ '<|im_start|>assistant\\n' }}", "auto", "humaneval", "code"),  # no thinking of its own: the suite's
    ("{{ '<|im_start|>assistant\\n' }}", "auto", "longproc:tom_tracking", "trace"),
    ("{{ '<|im_start|>assistant\\n<think>\\n' }}", "code", "humaneval", "code"),  # --template given: it
])
def test_the_bench_runs_a_reasoning_model_in_its_own_format(chat_template, flag, suite, expected):
    from types import SimpleNamespace

    from ssr.bench.runner import bench_template

    model = SimpleNamespace(template=flag, engine=SimpleNamespace(chat_template=chat_template))
    assert bench_template(model, suite) == expected
