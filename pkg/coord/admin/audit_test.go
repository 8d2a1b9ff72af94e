package admin

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit log keeps the newest AuditKeep entries (give or take the
// trimming slack), reads newest first, and filters by job and actor.
func TestAuditLogIsBoundedAndOrdered(t *testing.T) {
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	total := keyspace.AuditKeep + auditSlack + 10
	for i := range total {
		actor := "token:alice"
		if i%2 == 1 {
			actor = "cli:bob@h1"
		}
		if _, err := New(cli, keys).RecordAudit(ctx, keyspace.AuditEntry{Actor: actor, Action: "trigger", Job: fmt.Sprintf("j%d", i%3),
			Target: "job", Outcome: keyspace.AuditOK, Message: fmt.Sprint(i), Time: time.Unix(1e9+int64(i), 0).UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := cli.Get(ctx, keys.Audit(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if n.Count < keyspace.AuditKeep || n.Count > keyspace.AuditKeep+auditSlack {
		t.Errorf("%d entries kept after %d appends, want %d to %d", n.Count, total, keyspace.AuditKeep, keyspace.AuditKeep+auditSlack)
	}
	all, err := New(cli, keys).Audit(ctx, AuditFilter{Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range all {
		got = append(got, e.Message)
	}
	want := []string{fmt.Sprint(total - 1), fmt.Sprint(total - 2), fmt.Sprint(total - 3), fmt.Sprint(total - 4), fmt.Sprint(total - 5)}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("newest 5: %v, want %v", got, want)
	}
	bob, err := New(cli, keys).Audit(ctx, AuditFilter{Actor: "cli:bob@h1", Job: "j1", Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range bob {
		if e.Actor != "cli:bob@h1" || e.Job != "j1" {
			t.Errorf("filtered entry %+v", e)
		}
	}
	if len(bob) != 3 {
		t.Errorf("%d entries for bob on j1, want 3", len(bob))
	}
}

// Appenders that trim at once keep at least AuditKeep entries between
// them (each trims to the newest AuditKeep of a fresh read).
func TestConcurrentAuditTrims(t *testing.T) {
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	for i := range keyspace.AuditKeep + auditSlack {
		if _, err := New(cli, keys).RecordAudit(ctx, keyspace.AuditEntry{Actor: "cli:a@h", Action: "trigger", Target: "job j", Outcome: keyspace.AuditOK,
			Time: time.Unix(1e9+int64(i), 0).UTC()}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			New(cli, keys).RecordAudit(ctx, keyspace.AuditEntry{Actor: "token:x", Action: "kill", Target: fmt.Sprint("job j ", i), Outcome: keyspace.AuditOK})
		}()
	}
	wg.Wait()
	n, err := cli.Get(ctx, keys.Audit(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if n.Count < keyspace.AuditKeep || n.Count > keyspace.AuditKeep+auditSlack+20 {
		t.Errorf("%d entries left after 20 concurrent appends to a full log, want %d to %d", n.Count, keyspace.AuditKeep, keyspace.AuditKeep+auditSlack+20)
	}
	newest, err := New(cli, keys).Audit(ctx, AuditFilter{Actor: "token:x"})
	if err != nil || len(newest) != 20 {
		t.Errorf("the 20 newest entries: %d found (%v)", len(newest), err)
	}
}

// No field of an entry can hold a line break or grow without bound: an
// entry cannot pass for another in `shardd audit`'s table.
func TestAuditEntriesAreOneBoundedLine(t *testing.T) {
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	forged := "x\n2030-01-01T00:00:00Z  token:admin  disable  job payments  ok\r\x1b[2J"
	e, err := New(cli, keys).RecordAudit(ctx, keyspace.AuditEntry{Actor: "token:a", Action: "trigger", Job: forged, Target: strings.Repeat("t", 70000),
		Detail: forged, Message: strings.Repeat("m", 70000), Outcome: keyspace.AuditOK})
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"job": e.Job, "target": e.Target, "detail": e.Detail, "message": e.Message} {
		if strings.ContainsAny(v, "\n\r\x1b") || len(v) > keyspace.MaxAuditText {
			t.Errorf("%s is %d bytes, control characters %v", name, len(v), strings.ContainsAny(v, "\n\r\x1b"))
		}
	}
	if len(e.Target) > keyspace.MaxAuditName {
		t.Errorf("target kept %d bytes, want at most %d", len(e.Target), keyspace.MaxAuditName)
	}
}

func TestActorMatches(t *testing.T) {
	for _, tt := range []struct {
		actor, want string
		ok          bool
	}{
		{"cli:root@vm", "", true},
		{"cli:root@vm", "cli:root@vm", true},
		{"cli:root@vm", "cli", true},
		{"cli:root@vm", "cli:", true},
		{"cli:root@vm", "cli:root", true},
		{"cli:root@vm", "cli:ro", false},
		{"token:alice", "token", true},
		{"token:alice", "token:al", false},
		{"token:alice", "cli", false},
		{"instance:a", "instance:a", true},
	} {
		if got := actorMatches(tt.actor, tt.want); got != tt.ok {
			t.Errorf("actorMatches(%q, %q) = %v, want %v", tt.actor, tt.want, got, tt.ok)
		}
	}
}
