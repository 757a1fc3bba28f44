"""ssr: self-speculation for reasoning models, lossless and measured."""
from .api import SSR
from .config import ConfigError, GenerationConfig, SamplingParams, SuffixParams
from .loop import Chunk, Generation, Result

__all__ = ["SSR", "ConfigError", "GenerationConfig", "SamplingParams", "SuffixParams",
           "Chunk", "Generation", "Result"]
__version__ = "0.1.0"
