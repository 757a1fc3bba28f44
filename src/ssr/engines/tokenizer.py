"""Text side of engines built on a Hugging Face tokenizer (transformers, vLLM): token ids
from text, the bytes each token decodes to, the tokens that end generation."""
from __future__ import annotations

import json

END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>",
              "<turn|>")  # chat end markers that end generation, as llama.cpp's end-of-generation set


class TokenizerText:
    """A transformers tokenizer seen through the engine protocol's text methods."""

    def __init__(self, tokenizer, generation_eos=None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self.bos_text = tokenizer.bos_token or ""
        self.eos_text = tokenizer.eos_token or ""
        self.add_bos = tokenizer.bos_token_id is not None and bool(getattr(tokenizer, "add_bos_token", False))
        self.eos_ids = end_ids(tokenizer, generation_eos)
        self._byte_decoder = byte_level_decoder(tokenizer)  # None unless GPT-2 byte-level BPE
        self._special_ids = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        return ([bos] if add_bos and bos is not None else []) + ids

    def token_bytes(self, token_id: int) -> bytes:
        if token_id >= len(self.tokenizer):
            return b""
        if token_id in self._special_ids:
            return self.tokenizer.decode([token_id]).encode("utf-8")
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if self._byte_decoder is not None and all(c in self._byte_decoder for c in piece):
            return bytes(self._byte_decoder[c] for c in piece)
        if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # sentencepiece byte fallback
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")


def end_ids(tokenizer, generation_eos=None) -> frozenset[int]:
    """EOS, the generation config's end ids and the chat end markers in the vocabulary."""
    ids = {tokenizer.eos_token_id}
    ids.update(generation_eos if isinstance(generation_eos, (list, tuple, set)) else [generation_eos])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_TOKENS if token in vocab)
    return frozenset(i for i in ids if i is not None)


def byte_level_decoder(tokenizer) -> dict[str, int] | None:
    """GPT-2 byte-level BPE: the char -> byte map, None for other tokenizers."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    if not decoder or "ByteLevel" not in json.dumps(decoder):
        return None
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}
