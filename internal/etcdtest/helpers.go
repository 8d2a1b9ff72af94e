package etcdtest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Eventually polls cond every 10 ms until it holds, and returns how long
// that took; after timeout it fails t, saying what it waited for.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// StoredMap reads job's shard map under the default prefix; nil when
// there is none, or none that decodes.
func StoredMap(cli *clientv3.Client, job string) *keyspace.ShardMap {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keyspace.NewKeys("").Shards(job))
	if err != nil || len(resp.Kvs) == 0 {
		return nil
	}
	m, err := keyspace.DecodeShardMap(resp.Kvs[0].Value)
	if err != nil {
		return nil
	}
	return m
}

// LeaderOf returns the instance leading job under the default prefix (the
// oldest election key's value), "" when none does.
func LeaderOf(cli *clientv3.Client, job string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keyspace.NewKeys("").Leader(job), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// YAMLQuote quotes s as a YAML double-quoted scalar (a JSON string is
// one), for the job files tests write.
func YAMLQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
