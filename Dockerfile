# repack plan service. Build: docker build -t repack .
# Run: docker run -p 8000:8000 -v repack-data:/data -e REPACK_TOKENS_FILE=/data/tokens.yaml repack
# (tokens: `repack token NAME`, docs/api.md; REPACK_ALLOW_ANONYMOUS=true serves anyone instead).
# Several replicas behind nginx on PostgreSQL: deploy/compose.yaml.
# Stage 1 builds a virtual environment with the service's dependencies; stage 2 copies only it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY solver ./solver
# solver/scenarios links to the top-level scenarios/: the wheel holds the files themselves.
COPY scenarios ./scenarios
COPY api ./api
COPY cli ./cli
COPY runtime_client ./runtime_client
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/venv/bin/pip install --no-cache-dir '.[api]'

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 repack \
 && mkdir /data \
 && chown repack:repack /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    REPACK_HOST=0.0.0.0 \
    REPACK_PORT=8000 \
    REPACK_DATABASE_URL=sqlite:////data/repack.db
USER repack
WORKDIR /home/repack
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('REPACK_PORT', '8000'), timeout=2)"]
CMD ["repack", "serve"]
