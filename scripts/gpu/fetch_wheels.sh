#!/usr/bin/env bash
# The wheels the worker imports that the device machine lacks (it has Python 3.12, torch,
# triton, transformers, aiohttp, prometheus-client: ../shared/GPU_NOTES.md), downloaded here
# into .whl/ for Python 3.12; device_env.sh installs them there. Carry [".whl"] (about 20 MB;
# with the bundled tokenizer, saved for bench_grammar.py).
# A wheel missing there fails every run of the call at its first import, and the call is lost.
# Usage (on this machine, from anywhere): bash scripts/gpu/fetch_wheels.sh
set -eu
cd "$(dirname "$0")/../.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
wheels() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "$@"; }
wheels flashinfer-python==0.5.3 xgrammar==0.2.8 gguf pydantic annotated-types \
  typing-inspection python-json-logger jsonschema jsonschema-specifications referencing attrs
# peft (and its accelerate): tests/gpu/test_lora_gpu.py checks the LoRA kernels against PEFT
wheels peft==0.21.2 accelerate==1.16.0
core=$(unzip -p .whl/pydantic-[0-9]*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==//p')
wheels --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  'apache-tvm-ffi>=0.1,<0.2' pyzmq rpds-py fastsafetensors msgspec cbor2 "pydantic-core==$core"
# the bundled SmolLM2 tokenizer for bench_grammar.py (headline.sh's grammar stage skips without it)
if [ ! -d .whl/smollm2-tokenizer ]; then
  PYTHONPATH=worker "${PYTHON:-.venv/bin/python}" -c "from radixserve.model_loader.tokenizer import \
bundled_tokenizer; bundled_tokenizer().save_pretrained('.whl/smollm2-tokenizer')"
fi
ls .whl
