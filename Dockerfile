# Multi-stage build: a static shardd binary on a small Debian base (scripts
# need /bin/sh and the usual tools), run as a non-root user.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/shardd/shardd/pkg/version.Version=${VERSION}" -o /out/shardd ./cmd/shardd

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl tzdata \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/shardd --create-home shardd
COPY --from=build /out/shardd /usr/local/bin/shardd
USER 10001:10001
WORKDIR /var/lib/shardd
EXPOSE 9741
ENTRYPOINT ["/usr/local/bin/shardd"]
CMD ["run", "--config", "/etc/shardd/jobs.yaml", "--listen", "0.0.0.0:9741"]
