"""Tokenizers without a model: text -> token ids for replaying text traces (`ssr traces`).

A GGUF's own vocabulary through llama.cpp (vocab_only: the weights are not loaded; the
default model's GGUF carries Qwen2's byte-level BPE, which Qwen3, QwQ and the R1-Distill-Qwen
models share), or a Hugging Face tokenizer.json through the `tokenizers` library (a model
folder holding one, or the file itself).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from ..config import ConfigError


class GgufVocab:
    """The vocabulary of a GGUF file, loaded alone."""

    def __init__(self, path: Path) -> None:
        import llama_cpp

        from .llamacpp import _silent_log

        self._lib = lib = llama_cpp
        lib.llama_log_set(_silent_log(), ctypes.c_void_p(0))
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.vocab_only = True
        self._model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ConfigError(f"llama.cpp could not read a vocabulary from {path}")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.vocab_size = lib.llama_vocab_n_tokens(self._vocab)  # ids are below this
        self.name = Path(path).stem

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of text (no BOS); special: parse special-token text (chat markers)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(self._vocab, data, len(data), buffer, capacity, False, special)
        return list(buffer[:count])

    def token_starts(self, text: str) -> tuple[list[int], list[int]]:
        """(token ids of text, each token's first character's offset in it): a byte-level
        vocabulary's token is its bytes (llamacpp.token_piece), counted along the text's UTF-8."""
        from .llamacpp import token_piece

        ids = self.tokenize(text)
        char_of = [index for index, char in enumerate(text) for _ in char.encode("utf-8")]
        starts, at = [], 0
        for token in ids:
            starts.append(char_of[min(at, len(char_of) - 1)] if char_of else 0)
            at += len(token_piece(self._lib, self._vocab, token))
        return ids, starts

    def __del__(self) -> None:
        if getattr(self, "_model", None):
            self._lib.llama_model_free(self._model)
            self._model = None


class JsonVocab:
    """A Hugging Face tokenizer.json (the `tokenizers` library, installed with transformers)."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as error:
            raise ConfigError("a tokenizer.json needs the tokenizers library: pip install -e '.[torch]' in ssr's checkout") from error
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # the library raises its own exception types
            raise ConfigError(f"cannot read tokenizer {path}: {error}") from error
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.name = Path(path).parent.name or Path(path).stem

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of text (no BOS); the library parses its added tokens (chat markers) always."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def token_starts(self, text: str) -> tuple[list[int], list[int]]:
        """(token ids of text, each token's first character's offset in it)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, [start for start, _ in encoding.offsets]


def load_vocab(spec: str):
    """A registry model name or .gguf path (its vocabulary), a tokenizer.json, or a folder
    holding one."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "tokenizer.json").is_file():
            raise ConfigError(f"{spec}: no tokenizer.json in that folder")
        return JsonVocab(path / "tokenizer.json")
    if path.suffix == ".json":
        if not path.is_file():
            raise ConfigError(f"{spec}: no such tokenizer file")
        return JsonVocab(path)
    from ..models import resolve_model

    return GgufVocab(resolve_model(spec))
