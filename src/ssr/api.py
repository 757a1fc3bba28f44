"""The library's front door: a model loaded once, requests generated from prompts."""
from __future__ import annotations

from functools import cached_property

from .config import GenerationConfig
from .decode import Generation, Result
from .engines import Engine, load_engine
from .models import DEFAULT_MODEL
from .thinking import ThinkingFormat, build_messages, detect_format, render_chat


class SSR:
    """A model behind an engine, with its thinking format.

    >>> model = SSR("smollm2-135m")
    >>> result = model.generate("Write a function that adds two numbers.", GenerationConfig())
    """

    def __init__(self, model: str = DEFAULT_MODEL, engine: str = "llama.cpp",
                 template: str = "auto", **engine_options) -> None:
        self.model_name = model
        self.engine: Engine = load_engine(model, engine, **engine_options)
        self.format: ThinkingFormat = detect_format(self.engine.chat_template, template)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Chat-templated prompt, the assistant turn opened with the thinking start marker."""
        text = render_chat(self.engine.chat_template, build_messages(prompt, self.format),
                           self.engine.bos_text, self.engine.eos_text)
        add_bos = getattr(self.engine, "add_bos", False) and not text.startswith(self.engine.bos_text or "\0")
        return self.engine.tokenize(text + self.format.start, add_bos=add_bos)

    @cached_property
    def banned_ids(self) -> list[int]:
        """Tokens whose text contains a banned substring (code fences while thinking)."""
        banned = self.format.banned_while_thinking
        if not banned:
            return []
        pieces = (self.engine.token_bytes(t).decode("utf-8", "ignore") for t in range(self.engine.vocab_size))
        return [t for t, piece in enumerate(pieces) if any(b in piece for b in banned)]

    def start(self, prompt: str, config: GenerationConfig) -> Generation:
        """A request ready to iterate (streaming); `.result` once iterated."""
        return Generation(self.engine, self.format, config, self.prompt_ids(prompt), self.banned_ids)

    def generate(self, prompt: str, config: GenerationConfig) -> Result:
        return self.start(prompt, config).run()
