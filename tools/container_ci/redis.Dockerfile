# Stand-in for the public redis image, for machines with no registry (tools/container_ci.sh tags it
# docker.io/library/redis:7-alpine). Debian's redis-server on the stand-in python base; non-root like
# the official image once its entrypoint has dropped privileges. Not used where the registry answers.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends redis-server redis-tools; \
    rm -rf /var/lib/apt/lists/*; \
    mkdir -p /data; chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
