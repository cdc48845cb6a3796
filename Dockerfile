# The Vigil daemon as a container image; ops/compose.yaml builds it.
#
#   docker build -t vigil .
#   docker run --rm -v "$PWD/vigil.toml:/etc/vigil/vigil.toml:ro" -p 127.0.0.1:9464:9464 \
#       vigil run --config /etc/vigil/vigil.toml
#
# The entrypoint is the `vigil` command, so the container's arguments are its
# subcommand and options (`run --config ...`, `check-config ...`, `demo`, ...).
# In a container set `[metrics] host = "0.0.0.0"` so the published port reaches
# the endpoint, and keep `[state] dir` under /var/lib/vigil (the only directory
# the vigil user can write; mount a volume there to keep snapshots).
# The image includes the dask extra, so `[offload] engine = "dask"` works in it.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . .
RUN pip install '.[dask]' \
    && groupadd --system --gid 10001 vigil \
    && useradd --system --uid 10001 --gid vigil --home-dir /var/lib/vigil --create-home \
        --shell /usr/sbin/nologin vigil

# numeric, so Kubernetes' runAsNonRoot can check it (the Helm chart runs as 10001)
USER 10001:10001
WORKDIR /var/lib/vigil
# /metrics, /healthz and /readyz ([metrics] port).
EXPOSE 9464
ENTRYPOINT ["vigil"]
CMD ["--help"]
