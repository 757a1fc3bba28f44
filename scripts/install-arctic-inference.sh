#!/usr/bin/env bash
# arctic-inference 0.3.0 (the C++ suffix tree vLLM's `--speculative-method suffix` runs on) into a
# vLLM environment: scripts/install-arctic-inference.sh [.venv-vllm]
# PyPI has only its sdist, whose isolated build asks for a torch of its own (a CUDA build: GBs);
# this builds it against the environment's own torch. Only the suffix tree is compiled (C++20,
# nanobind, ~15 s); its CUDA kernels are not (vLLM's suffix method does not use them).
set -euo pipefail
venv_bin="$(cd "${1:-.venv-vllm}/bin" && pwd)"
"$venv_bin/python" -m pip install --quiet nanobind==2.9.2 grpcio-tools==1.85.1 cmake==4.4.5 ninja==1.13.2
PATH="$venv_bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$venv_bin/python" \
    "$venv_bin/python" -m pip install --quiet --no-build-isolation --no-deps arctic-inference==0.3.0
"$venv_bin/python" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache"
