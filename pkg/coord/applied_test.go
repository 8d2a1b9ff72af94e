package coord

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// labelled is a beforeRun that gives a test node labels and an accept
// policy.
func labelled(accept bool, labels ...string) func(*Node) {
	return func(n *Node) {
		n.opts.Info.Labels = map[string]string{}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			n.opts.Info.Labels[k] = v
		}
		n.opts.Accept = config.AcceptPolicy{Applied: accept}
	}
}

func instanceInfo(t *testing.T, cli *clientv3.Client, id string) keyspace.InstanceInfo {
	t.Helper()
	resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Instance(id))
	if err != nil || len(resp.Kvs) == 0 {
		return keyspace.InstanceInfo{}
	}
	var in keyspace.InstanceInfo
	json.Unmarshal(resp.Kvs[0].Value, &in)
	return in
}

// An applied job runs on the instances that accept applied definitions and
// match its selector, and on no other; a change of its selector moves its
// items, a rollback moves them back, a delete ends it everywhere. An
// instance that matches but does not accept says why in its key.
func TestAppliedJobRunsWhereSelectedAndAccepted(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	a := startNodeWith(t, srv, "a", nil, nil, labelled(true, "role=db"))
	b := startNodeWith(t, srv, "b", nil, nil, labelled(true, "role=web"))
	c := startNodeWith(t, srv, "c", nil, nil, labelled(false, "role=db"))
	d := startNodeWith(t, srv, "d", nil, nil, labelled(true, "role=db"), func(n *Node) { n.opts.Accept.CommandDirs = []string{"/opt/jobs"} })
	adm := admin.New(cli, a.Keys())
	ctx := context.Background()
	apply := func(selector string) []admin.ApplyResult {
		t.Helper()
		js := jobs(t, "jobs:\n"+job("etl", 2, "    instances: {selector: \""+selector+"\"}\n"))
		res, err := adm.Apply(ctx, js, admin.ApplyOptions{By: "test"})
		if err != nil {
			t.Fatalf("apply: %v %+v", err, res)
		}
		return res
	}
	if res := apply("role=db"); res[0].Action != "create" || res[0].Version != 1 {
		t.Fatalf("first apply: %+v", res[0])
	}
	etcdtest.Eventually(t, 20*time.Second, "etl on a only", func() bool {
		return agreed(t, cli, "etl", map[string][]int{"a": {0, 1}}, a)
	})
	etcdtest.Eventually(t, 10*time.Second, "c to say it accepts no applied definition", func() bool {
		in := instanceInfo(t, cli, "c")
		return in.ID == "c" && !in.Accepts.Applied && len(in.Refused) == 0 // said once, not once a job
	})
	etcdtest.Eventually(t, 10*time.Second, "d to report its refusal", func() bool {
		return strings.Contains(instanceInfo(t, cli, "d").Refused["etl"], "script.command runs /bin/true, which is not under --accept-command-dir /opt/jobs")
	})
	if slices.Contains(d.Jobs(), "etl") {
		t.Error("d, which refuses etl, has it")
	}
	if in := instanceInfo(t, cli, "b"); len(in.Refused) > 0 || slices.Contains(in.Jobs, "etl") {
		t.Errorf("b (not selected) has the job or a refusal: %+v", in)
	}
	st, err := adm.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	js := st.Jobs[0]
	if p := js.Placement; p == nil || p.Selector != "role=db" || !slices.Equal(p.Matching, []string{"a", "c", "d"}) || !strings.Contains(p.Refusing["c"], "--accept-applied") || !strings.Contains(p.Refusing["d"], "--accept-command-dir") {
		t.Errorf("status placement: %+v", js.Placement)
	}
	if d := js.Definition; d == nil || d.Source != "applied" || d.By != "test" || d.Version != 1 {
		t.Errorf("status definition: %+v", js.Definition)
	}
	if !slices.ContainsFunc(js.Problems, func(p string) bool {
		return strings.Contains(p, "instance c matches the selector but does not run the applied job")
	}) {
		t.Errorf("status problems %q: want c's refusal", js.Problems)
	}

	// Widen the selector: b joins, c still refuses.
	if res := apply("role in (db,web)"); res[0].Action != "update" || res[0].Version != 2 || len(res[0].Diff) != 1 || res[0].Diff[0].Field != "instances.selector" {
		t.Fatalf("second apply: %+v", res[0])
	}
	etcdtest.Eventually(t, 20*time.Second, "etl on a and b", func() bool {
		return agreed(t, cli, "etl", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
	if res := apply("role in (db,web)"); res[0].Action != "unchanged" {
		t.Fatalf("the same apply again: %+v", res[0])
	}

	// Roll back to version 1: back on a only, as a new version 3.
	r, err := adm.Rollback(ctx, "etl", 1, "test")
	if err != nil || r.Version != 3 {
		t.Fatalf("rollback: %+v, %v", r, err)
	}
	etcdtest.Eventually(t, 20*time.Second, "etl back on a only", func() bool {
		return agreed(t, cli, "etl", map[string][]int{"a": {0, 1}}, a)
	})
	vs, err := adm.Versions(ctx, "etl")
	if err != nil || len(vs) != 3 || !vs[0].Current || vs[0].Change != "rollback" || vs[0].Of != 1 || vs[2].Version != 1 {
		t.Fatalf("versions: %+v, %v", vs, err)
	}

	// Delete: every instance leaves, every key goes.
	removed, err := adm.DeleteApplied(ctx, "etl", "test", 20*time.Second)
	if err != nil || !removed {
		t.Fatalf("delete: %v, %v", removed, err)
	}
	etcdtest.Eventually(t, 10*time.Second, "no instance to have etl", func() bool {
		for _, n := range []*testNode{a, b, c, d} {
			if slices.Contains(n.Jobs(), "etl") {
				return false
			}
		}
		return true
	})
	resp, _ := cli.Get(ctx, a.Keys().JobPrefix("etl"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if resp.Count != 0 {
		t.Errorf("%d keys of etl left after delete", resp.Count)
	}
	audit, _ := adm.Audit(ctx, admin.AuditFilter{Job: "etl"})
	var actions []string
	for _, e := range audit {
		actions = append(actions, e.Action+"/"+e.Outcome)
	}
	if want := []string{"delete/ok", "rollback/ok", "apply/ok", "apply/ok"}; !slices.Equal(actions, want) {
		t.Errorf("audit of etl: %v, want %v", actions, want)
	}
}

// A job that hosts' files define is not taken over by apply unless asked
// to; once it is, the file host that does not accept applied definitions
// leaves it, says that its file is behind, and no file publishes over the
// applied definition; delete is refused while a live host's file defines
// the job.
func TestApplyOverAFileJob(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	file := startNodeWith(t, srv, "file", jobs(t, "jobs:\n"+job("report", 1)), nil, labelled(false))
	acc := startNodeWith(t, srv, "acc", nil, nil, labelled(true))
	etcdtest.Eventually(t, 20*time.Second, "report on file", func() bool {
		return agreed(t, cli, "report", map[string][]int{"file": {0}}, file)
	})
	adm := admin.New(cli, file.Keys())
	ctx := context.Background()
	js := jobs(t, "jobs:\n"+job("report", 2))
	if _, err := adm.Apply(ctx, js, admin.ApplyOptions{By: "test"}); !errors.Is(err, admin.ErrRefused) {
		t.Fatalf("apply over a file job without --take-over: %v, want a refusal", err)
	}
	// Nor rolled back: what an operator writes is applied, not a file's.
	if _, err := adm.Rollback(ctx, "report", 1, "test"); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "defined in the hosts' files") {
		t.Fatalf("rollback of a file job: %v, want a refusal", err)
	}
	res, err := adm.Apply(ctx, js, admin.ApplyOptions{By: "test", TakeOver: true})
	if err != nil || res[0].Action != "take-over" {
		t.Fatalf("take-over: %+v, %v", res, err)
	}
	etcdtest.Eventually(t, 20*time.Second, "report on acc only", func() bool {
		return agreed(t, cli, "report", map[string][]int{"acc": {0, 1}}, acc)
	})
	etcdtest.Eventually(t, 10*time.Second, "file to say its file is behind", func() bool {
		return slices.Equal(instanceInfo(t, cli, "file").AppliedOverFiles, []string{"report"})
	})
	// A reload of the file host (its file unchanged) publishes nothing.
	file.SetJobs(jobs(t, "jobs:\n"+job("report", 1)))
	time.Sleep(500 * time.Millisecond)
	d, err := adm.Definition(ctx, "report")
	if err != nil || !d.Applied() || d.Job.ShardingTotalCount != 2 {
		t.Fatalf("after the file host's reload: %+v, %v", d, err)
	}
	if _, err := adm.DeleteApplied(ctx, "report", "test", time.Second); err == nil || !strings.Contains(err.Error(), "files of file") {
		t.Fatalf("delete while a host's file defines it: %v, want a refusal naming the host", err)
	}
}

// A file job's selector chooses among the hosts that define it; an edit of
// the selector moves the job: the host it no longer matches leaves (its
// task parks), the one it now matches joins (its parked task is woken by
// the definition's change).
func TestFileJobSelectorParksAndWakes(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	def := func(zone string) []*config.Job {
		return jobs(t, "jobs:\n"+job("f", 2, "    instances: {selector: \"zone="+zone+"\"}\n"))
	}
	x := startNodeWith(t, srv, "x", def("a"), nil, labelled(false, "zone=a"))
	y := startNodeWith(t, srv, "y", def("a"), nil, labelled(false, "zone=b"))
	etcdtest.Eventually(t, 20*time.Second, "f on x only", func() bool {
		return agreed(t, cli, "f", map[string][]int{"x": {0, 1}}, x)
	})
	if keyExists(t, cli, y.Keys().Member("f", "y")) {
		t.Fatal("y, which the selector does not match, is a member of f")
	}
	x.SetJobs(def("b")) // x's edit publishes; y's task wakes on the change
	etcdtest.Eventually(t, 20*time.Second, "f on y only", func() bool {
		return agreed(t, cli, "f", map[string][]int{"y": {0, 1}}, y)
	})
	if keyExists(t, cli, x.Keys().Member("f", "x")) {
		t.Error("x is still a member of f, which no longer selects it")
	}
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// A task whose definition is an applied one never publishes it: when its
// registration finds the config key gone (shardd delete, before the
// catalog has dropped the job), it is refused, and the job does not come
// back as a file job.
func TestAppliedDefinitionIsNeverPublished(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	n := startNodeWith(t, srv, "a", nil, nil, labelled(true))
	def := jobs(t, "jobs:\n"+job("gone", 1))[0]
	_, err := n.registerConfig(context.Background(), def, true)
	var ne *notEligibleError
	if !errors.As(err, &ne) {
		t.Fatalf("registration of an applied definition with no config key: %v, want a refusal", err)
	}
	if keyExists(t, cli, n.Keys().Config("gone")) || keyExists(t, cli, n.Keys().Loaded("gone", "a")) {
		t.Fatal("the applied definition was published, or recorded as loaded from a file")
	}
	// The same definition from a file is published.
	if _, err := n.registerConfig(context.Background(), def, false); err != nil || !keyExists(t, cli, n.Keys().Config("gone")) {
		t.Fatalf("a file's definition: %v, published %v", err, keyExists(t, cli, n.Keys().Config("gone")))
	}
}
