# tacit serve on CPU: docs/serving/deployment.md ("Docker") says how to build and run it.
# This image has not been built where it was written (no Docker daemon there): tests/test_deploy_files.py
# checks what can be checked without one (the torch pin, the COPY sources, the entrypoint's flags).
FROM python:3.11-slim

# g++: the AVX512-BF16 kernels compile on first use, on the CPU that runs the container (2-5 min,
# then cached in TACIT_CACHE_DIR); without a compiler tacit runs its torch path and says so.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --home-dir /home/tacit --shell /usr/sbin/nologin tacit
WORKDIR /opt/tacit

# torch first and pinned, as scripts/setup.sh does: an unpinned resolve pulls a several-GB CUDA
# build. The CPU wheel index keeps it CPU-only; override TORCH_INDEX_URL for another build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" torch==2.13.0

COPY pyproject.toml README.md ./
COPY tacit ./tacit
RUN pip install --no-cache-dir '.[serve]'

USER tacit
ENV TACIT_CACHE_DIR=/home/tacit/.cache/tacit HF_HOME=/home/tacit/.cache/huggingface HF_HUB_OFFLINE=1
# The default model, at build time, by the command scripts/setup.sh runs: nothing downloads at run time.
RUN tacit fetch

EXPOSE 8000
# Exec form: tacit serve is PID 1 and gets `docker stop`'s SIGTERM itself, then drains in-flight
# requests for --shutdown-timeout seconds (give `docker stop -t` more than that: its default is 10).
# Arguments after the image name are added: `docker run ... tacit --model Qwen/Qwen3-0.6B`.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["tacit", "serve", "--host", "0.0.0.0", "--port", "8000"]
