"""The library's front door: a model loaded once, requests generated from prompts."""
from __future__ import annotations

from dataclasses import replace

from .config import GenerationConfig
from .loop import Generation, Result
from .engines import Engine, load_engine
from .models import DEFAULT_MODEL
from .pricing.costs import CostModel
from .pricing.drafting import PolicyStats
from .proposing.history import ResponseHistory
from .formats.thinking import ThinkingFormat, build_messages, detect_format, render_chat, with_system
from .formats.tools import (ToolUse, detect_tool_format, escaped_views, forced_call_prefix, hermes_messages,
                            message_texts, template_messages, template_renders_tools)


class SSR:
    """A model behind an engine; each request picks its thinking format.

    >>> model = SSR("smollm2-135m")
    >>> result = model.generate("Write a function that adds two numbers.", GenerationConfig())
    """

    def __init__(self, model: str = DEFAULT_MODEL, engine: str | Engine = "llama.cpp",
                 template: str = "auto", **engine_options) -> None:
        self.model_name = model
        # an engine name to load `model` with, or an engine instance already loaded
        self.engine: Engine = load_engine(model, engine, **engine_options) if isinstance(engine, str) else engine
        self.template = template  # default thinking format for requests
        self.format(template)  # validate it now
        self._banned: dict[tuple[str, ...], list[int]] = {}
        self._costs: CostModel | None = None  # engine costs, measured on first use (see costs)
        self.stats = PolicyStats()  # what earlier requests showed, for the policy
        self.history = ResponseHistory()  # earlier responses, for suffix trees (as vLLM's global tree)

    @property
    def costs(self) -> CostModel:
        """The engine's cost table (measured once per engine setup, cached on disk, rescaled
        to the machine's speed at start-up); each request starts from it and learns from its
        own calls."""
        if self._costs is None:
            import sys

            from .pricing.costs import gpu_preset
            from .pricing.probe import engine_costs

            table = gpu_preset() if self.requests_based else \
                engine_costs(self.engine, log=lambda line: print(line, file=sys.stderr))  # vLLM: a child rides in its batch
            self._costs = CostModel(table=table)
        return self._costs

    @property
    def requests_based(self) -> bool:
        """An engine driven by requests (vLLM), not by sequence steps."""
        return self.engine.capabilities.requests

    def format(self, template: str | None = None, tools: ToolUse | None = None) -> ThinkingFormat:
        """The request's thinking format. With tools, a model without native thinking answers
        without thinking (format "none": a thinking template talks a small instruct model out
        of its tool-call format), and the answer starts with what tool_choice forces
        ("required": a call; a name: a call of it)."""
        template = template or self.template
        fmt = detect_format(self.engine.chat_template, template)
        if tools is None or not tools.active:
            return fmt
        if template == "auto" and fmt.system:  # a thinking template, not the model's own markers
            fmt = detect_format(self.engine.chat_template, "none")
        prefix = forced_call_prefix(detect_tool_format(self.engine.chat_template), tools.choice)
        return replace(fmt, answer_prefix=fmt.answer_prefix + prefix, answer_stop="") if prefix else fmt

    def prompt_ids(self, prompt: str | list[dict], template: str | None = None,
                   tools: ToolUse | None = None) -> list[int]:
        """Chat-templated prompt (one user turn, or a list of chat messages), the assistant
        turn opened with the thinking start marker; offered tools rendered as the template
        renders them (or as a Hermes block where it renders none)."""
        fmt = self.format(template, tools)
        messages = build_messages(prompt, fmt) if isinstance(prompt, str) else with_system(prompt, fmt)
        offered = list(tools.tools) if tools is not None and tools.active else None
        if template_renders_tools(self.engine.chat_template):
            messages = template_messages(messages)
        else:
            messages, offered = hermes_messages(messages, offered), None
        text = render_chat(self.engine.chat_template, messages, self.engine.bos_text, self.engine.eos_text,
                           tools=offered)
        add_bos = getattr(self.engine, "add_bos", False) and not text.startswith(self.engine.bos_text or "\0")
        return self.engine.tokenize(open_thinking(text, fmt.start) + fmt.steer, add_bos=add_bos)

    def banned_ids(self, fmt: ThinkingFormat) -> list[int]:
        """Tokens whose text contains a banned substring (code fences while thinking)."""
        banned = fmt.banned_while_thinking
        if banned and banned not in self._banned:
            pieces = (self.engine.token_bytes(t).decode("utf-8", "ignore") for t in range(self.engine.vocab_size))
            self._banned[banned] = [t for t, piece in enumerate(pieces) if any(b in piece for b in banned)]
        return self._banned.get(banned, [])

    def start(self, prompt: str | list[dict], config: GenerationConfig, template: str | None = None,
              history: ResponseHistory | None = None, tools: ToolUse | None = None) -> Generation:
        """A request ready to iterate (streaming); `.result` once iterated. `history`: earlier
        responses to copy from (default: this model's earlier requests); `tools`: the request's
        tools (the answer's calls are read by the caller: tool_stream.CallStream; the messages'
        escaped views are sources to copy from, tools.escaped_views)."""
        fmt = self.format(template, tools)
        prompt_ids = self.prompt_ids(prompt, template, tools)
        config = for_format(config, fmt)
        if self.requests_based:
            from .loop.vllm_walk import VllmGeneration

            return VllmGeneration(self.engine, fmt, config, prompt_ids, self.banned_ids(fmt),
                                  costs=self.costs, stats=self.stats)
        views = []  # tools offered: calls write JSON, and ssr's proposer copies the messages escaped
        if tools is not None and tools.active and config.uses_draft:
            texts = [prompt] if isinstance(prompt, str) else message_texts(prompt)
            views = [self.engine.tokenize(view) for view in escaped_views(texts)]
        return Generation(self.engine, fmt, config, prompt_ids, self.banned_ids(fmt),
                          costs=self.costs, stats=self.stats, history=self.history if history is None else history,
                          views=views)

    def generate(self, prompt: str, config: GenerationConfig, template: str | None = None) -> Result:
        return self.start(prompt, config, template).run()


def for_format(config: GenerationConfig, fmt: ThinkingFormat) -> GenerationConfig:
    """The request's config under its thinking format: a template's budget where the request
    set none; no budget at all where the format has no thinking ("none")."""
    if fmt.budget == 0 and config.thinking_budget != 0:  # nothing to think inside
        return replace(config, thinking_budget=0, draft_at=0)
    if config.thinking_budget is None and fmt.budget is not None:
        at = {} if config.draft_at < fmt.budget else {"draft_at": fmt.budget // 2}
        return replace(config, thinking_budget=fmt.budget, **at)
    return config


def open_thinking(text: str, start: str) -> str:
    """The rendered prompt with the CoT's start marker after it, unless the chat template's
    generation prompt already opens the CoT (as QwQ's and DeepSeek-R1's do): the prompt is then
    the template's own, as the model is served plainly."""
    if start and text.rstrip().endswith(start.strip()):
        return text
    return text + start
