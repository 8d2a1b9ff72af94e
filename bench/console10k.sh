#!/usr/bin/env bash
# Times the console's pages with 10,000 jobs of 3 items on three instances and
# one etcd (loopback ports 23379, 23380 and 16080), after the cold start: the
# first page, pages while the console is in use, and the first page after
# three minutes unused. About 7 minutes on 2 cores. Run from the repository root.
set -euo pipefail
W=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
go build -o "$W/shardd" ./cmd/shardd
go build -o "$W/testetcd" ./internal/etcdtest/testetcd
"$W/testetcd" --data-dir "$W/etcd" --client-url http://127.0.0.1:23379 --peer-url http://127.0.0.1:23380 > "$W/etcd.out" 2>&1 &
PIDS+=($!)
{
  echo "jobs:"
  for i in $(seq 0 9999); do
    printf '  - name: job-%05d\n    cron: "0 0 0 1 1 ?"\n    shardingTotalCount: 3\n    script: [/bin/true]\n' "$i"
  done
} > "$W/jobs.yaml"
sleep 2
for i in 0 1 2; do
  listen=""; [ $i = 0 ] && listen=127.0.0.1:16080
  "$W/shardd" run --config "$W/jobs.yaml" --etcd http://127.0.0.1:23379 --name "i$i" --listen "$listen" \
    --log-level warn --data-dir "$W/data-i$i" 2> "$W/i$i.err" &
  PIDS+=($!)
done
t0=$(date +%s)
for _ in $(seq 1 60); do
  sleep 10
  ok=$("$W/shardd" status --etcd http://127.0.0.1:23379 -o json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(1 for j in d["jobs"] if j["status"]=="OK" and len(j["eligible"])==3))' 2>/dev/null || true)
  echo "$(( $(date +%s) - t0 ))s: ${ok:-?} jobs OK"
  [ "$ok" = 10000 ] && break
done
page() { curl -s -o /dev/null -w "%{http_code} %{time_total}s $1\n" "http://127.0.0.1:16080$1"; }
echo "first pages:"
for p in / /jobs "/jobs?page=100" "/jobs?q=job-0999" "/jobs?filter=failing" /jobs/job-01234 /instances /audit; do page "$p"; done
echo "in use, a page every 7 s:"
for n in $(seq 1 8); do sleep 7; page "/jobs?page=$n"; done
echo "after 3 minutes unused:"
sleep 180
page /jobs
page /jobs
