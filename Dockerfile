# syntax=docker/dockerfile:1
# Multi-stage build: compile with the Rust toolchain, run on a slim Debian as a non-root user.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artefacts between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin loupe \
    && cp target/release/loupe /usr/local/bin/loupe

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/loupe --create-home loupe
COPY --from=build /usr/local/bin/loupe /usr/local/bin/loupe
USER loupe
WORKDIR /var/lib/loupe
ENV LOUPE_ADDR=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///var/lib/loupe/data/loupe.db \
    LOUPE_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["loupe"]
CMD ["serve"]
