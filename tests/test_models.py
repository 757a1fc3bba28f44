"""Model registry: offline assembly with checksum, clear errors."""
import hashlib

import pytest

from ssr.config import ConfigError
from ssr.models import ModelSpec, _assemble, _materialise, resolve_model, resolve_source


def spec_for(parts, sha256=None):
    data = b"".join(parts)
    return ModelSpec(name="tiny", packages=("nope",) * len(parts), files=("x",) * len(parts), size=len(data),
                     sha256=sha256 or hashlib.sha256(data).hexdigest(), install="pip install tiny-parts==1.0")


def test_assemble_concatenates_and_checks(tmp_path):
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    paths = []
    for i, chunk in enumerate(chunks):
        path = tmp_path / f"part{i}.bin"
        path.write_bytes(chunk)
        paths.append(path)
    target = _assemble(spec_for(chunks), paths, tmp_path / "cache" / "tiny.gguf")
    assert target.read_bytes() == b"".join(chunks)
    with pytest.raises(ConfigError, match="sha256"):
        _assemble(spec_for(chunks, sha256="0" * 64), paths, tmp_path / "cache" / "bad.gguf")
    assert not (tmp_path / "cache" / "bad.gguf").exists()  # nothing half-written is left
    assert not list((tmp_path / "cache").glob("*.partial*"))


def test_missing_packages_name_the_install_command():
    with pytest.raises(ConfigError, match="pip install tiny-parts==1.0"):
        _materialise(spec_for([b"x", b"y"]))


def test_unknown_model_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown model"):
        resolve_model("gpt-17")
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        resolve_model(str(not_gguf))


@pytest.mark.model
def test_default_model_resolves_offline():
    path = resolve_model("smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size == 98362432


@pytest.mark.model
def test_transformers_sources(tmp_path):
    assert resolve_source("smollm2-135m") == str(resolve_model("smollm2-135m"))
    assert resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "config.json").write_text("{}")
    assert resolve_source(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_source(str(tmp_path.parent))
    with pytest.raises(ConfigError, match="a model folder or a hub id"):
        resolve_source("not a model")

