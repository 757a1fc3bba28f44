"""The decoding loop: one request walked through its stages (generation.py on sequence engines,
vllm_walk.py on vLLM), from composed parts. docs/architecture.md gives the reading path."""
from .generation import Generation
from .transcript import Chunk
from .walk import Result

__all__ = ["Chunk", "Generation", "Result"]
