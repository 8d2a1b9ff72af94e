#!/usr/bin/env bash
# Builds local stand-ins for the images the Dockerfile and the compose files
# name, for a Docker engine without an image registry (CI, an air-gapped
# host). Only images missing locally are built: where a registry is reachable,
# `docker-compose pull` (or the first `up`) fetches the real ones and this
# script does nothing:
#
#   debian:bookworm-slim    a minimal Debian bookworm (mmdebstrap, Debian's mirror),
#                           with /usr/local/share/ca-certificates of this machine
#   golang:1.26-bookworm    that plus git and this machine's Go toolchain (go1.26)
#   quay.io/coreos/etcd:vX  etcd built from go.etcd.io/etcd/server/v3 at the same
#                           version (the Go module proxy); no etcdctl
#   prom/prometheus:vX      Debian's Prometheus binary (its version, not the tag's;
#                           the compose file's configuration works with both)
#
# Needs: a running Docker engine, mmdebstrap, Go 1.26, Debian's prometheus
# package (/usr/bin/prometheus). `standins.sh --remove` removes the four names
# (the real images can then be pulled under them).
set -euo pipefail
export DOCKER_BUILDKIT=0 # the classic builder: no buildx plugin needed
cd "$(dirname "$0")/../.."

# The names, read from the files that use them.
from=($(awk '/^FROM /{print $2}' Dockerfile))
golang=${from[0]} slim=${from[1]}
etcd=$(grep -ohE 'image: quay.io/coreos/etcd:[^ ]+' docker-compose*.yml | head -1 | cut -d' ' -f2)
prom=$(grep -ohE 'image: prom/prometheus:[^ ]+' docker-compose*.yml | head -1 | cut -d' ' -f2)

if [ "${1:-}" = --remove ]; then
  for image in "$prom" "$etcd" "$golang" "$slim"; do
    docker rmi "$image" 2>/dev/null || true
  done
  exit 0
fi

have() { docker image inspect "$1" >/dev/null 2>&1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! have "$slim"; then
  echo "== $slim: Debian bookworm, minbase (mmdebstrap)"
  # With the certificate authorities this machine added itself (a
  # TLS-intercepting proxy's, say): inert until ca-certificates is installed,
  # as on a host, then trusted by the builds (go mod download) as here.
  hooks=()
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    hooks=(--customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share')
  fi
  mmdebstrap --variant=minbase --quiet "${hooks[@]}" bookworm "$tmp/rootfs.tar"
  docker import --change 'CMD ["bash"]' "$tmp/rootfs.tar" "$slim" >/dev/null
  rm -f "$tmp/rootfs.tar"
fi

if ! have "$golang"; then
  want=${golang#golang:}; want=go${want%%-*}
  goroot=$(go env GOROOT)
  case "$(go env GOVERSION)" in
    "$want" | "$want".*) ;;
    *) echo "standins: $golang needs $want; this machine's Go is $(go env GOVERSION)" >&2; exit 1 ;;
  esac
  echo "== $golang: $slim + git + $(go env GOVERSION) from $goroot"
  docker build -q -t "$golang" -f - "$goroot" >/dev/null <<DOCKERFILE
FROM $slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates git \\
    && rm -rf /var/lib/apt/lists/*
COPY . /usr/local/go
ENV GOPATH=/go PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN mkdir -p /go/bin /go/src && go version
WORKDIR /go
DOCKERFILE
fi

if ! have "$etcd"; then
  v=${etcd##*:}
  echo "== $etcd: etcd $v built from go.etcd.io/etcd/server/v3@$v"
  mkdir "$tmp/etcd"
  (cd "$tmp/etcd" && go mod init standin >/dev/null 2>&1 \
    && go get "go.etcd.io/etcd/server/v3@$v" 2>/dev/null \
    && CGO_ENABLED=0 go build -trimpath -o etcd go.etcd.io/etcd/server/v3)
  docker build -q -t "$etcd" -f - "$tmp/etcd" >/dev/null <<DOCKERFILE
FROM $slim
COPY etcd /usr/local/bin/etcd
WORKDIR /var/etcd
EXPOSE 2379 2380
CMD ["/usr/local/bin/etcd"]
DOCKERFILE
fi

if ! have "$prom"; then
  bin=$(command -v prometheus || true)
  [ -n "$bin" ] || { echo "standins: $prom needs Debian's prometheus package (apt-get install prometheus)" >&2; exit 1; }
  echo "== $prom: $($bin --version 2>&1 | head -1)"
  mkdir "$tmp/prom" && cp "$bin" "$tmp/prom/prometheus"
  docker build -q -t "$prom" -f - "$tmp/prom" >/dev/null <<DOCKERFILE
FROM $slim
COPY prometheus /bin/prometheus
RUN mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
fi
for image in "$slim" "$golang" "$etcd" "$prom"; do
  docker image inspect -f "$image {{.Created}} {{.Size}}" "$image"
done
