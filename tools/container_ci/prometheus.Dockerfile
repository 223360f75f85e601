# Stand-in for the public prom/prometheus image, for machines with no registry (tools/container_ci.sh
# tags it with the name docker-compose.yml uses). Debian's prometheus (2.42) on the stand-in python
# base, laid out like the official image: ENTRYPOINT /bin/prometheus, config in /etc/prometheus, data
# in /prometheus, user nobody, wget for the healthcheck. Not used where the registry answers.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends prometheus wget; \
    rm -rf /var/lib/apt/lists/*; \
    mkdir -p /prometheus /etc/prometheus; \
    chown nobody:nogroup /prometheus; \
    test -x /bin/prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
