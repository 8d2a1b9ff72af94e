#!/usr/bin/env bash
# make e2e-compose: runs the repository's compose files on a real Docker
# engine (internal/e2e/compose_test.go). Installs Debian's docker.io,
# docker-compose, mmdebstrap and prometheus when missing (as root), starts
# dockerd when none runs (and stops the one it started), builds local
# stand-ins for the base images when no registry has them
# (deploy/images/standins.sh), then runs the tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v prometheus >/dev/null || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "e2e-compose: install ${need[*]} (or run as root)" >&2
    exit 1
  fi
  echo "== install: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The prometheus package starts its own server on :9090, which the
  # compose file publishes: stop it (only the binary is wanted).
  if [[ " ${need[*]} " == *" prometheus "* ]]; then
    invoke-rc.d prometheus stop >/dev/null 2>&1 || true
  fi
fi

started=
if ! docker info >/dev/null 2>&1; then
  echo "== start dockerd"
  log=$(mktemp)
  dockerd >"$log" 2>&1 &
  started=$!
  trap 'kill "$started" 2>/dev/null; wait "$started" 2>/dev/null || true' EXIT
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$started" 2>/dev/null || { cat "$log"; echo "e2e-compose: dockerd exited" >&2; exit 1; }
    sleep 1
  done
  docker info >/dev/null 2>&1 || { tail -30 "$log"; echo "e2e-compose: dockerd did not answer in 60 s" >&2; exit 1; }
fi

echo "== base images (stand-ins for those no registry gave)"
bash deploy/images/standins.sh

echo "== compose tests"
SHARDD_E2E_COMPOSE=1 go test ./internal/e2e -run '^TestCompose' -count=1 -v -timeout 40m
