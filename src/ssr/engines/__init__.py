"""Engines: adapters behind one protocol (see base.Engine)."""
from .base import Engine, EngineError

__all__ = ["ENGINES", "Engine", "EngineError", "load_engine"]

ENGINES = ("llama.cpp", "transformers", "vllm")  # what --engine offers (the fake engine is for tests)


def load_engine(model: str, engine: str = "llama.cpp", **options) -> Engine:
    """Engine by name; heavy libraries are imported only here, lazily."""
    if engine in ("llama.cpp", "llamacpp"):
        from ..models import resolve_model
        from .llamacpp import LlamaCppEngine

        return LlamaCppEngine(resolve_model(model), **options)
    if engine in ("transformers", "hf"):
        from ..models import resolve_source
        from .hf import TransformersEngine

        return TransformersEngine(resolve_source(model), **options)
    if engine == "vllm":
        from .vllm import VllmEngine

        return VllmEngine(model, **options)
    if engine == "fake":
        from .fake import FakeEngine

        return FakeEngine(**options)
    if engine == "fake-requests":
        from .fake import FakeRequestsEngine

        return FakeRequestsEngine(**options)
    from ..config import ConfigError

    raise ConfigError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
