package coord

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A trigger is deleted only while etcd says what the deleting instance
// counted on: the disable marks it names exist, the definition is the
// generation that disabled the job, the key is the trigger read.
func TestDeleteTriggerComparesWhatEtcdSaysNow(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("j", 2)))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	put := func(id string) keyspace.Trigger {
		resp, err := cli.Put(ctx, keys.Trigger("j", id), `{"id":"`+id+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return keyspace.Trigger{ID: id, Rev: resp.Header.Revision, ModRev: resp.Header.Revision}
	}
	exists := func(id string) bool {
		resp, err := cli.Get(ctx, keys.Trigger("j", id))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}
	del := func(tr keyspace.Trigger, g TriggerGuard) bool {
		t.Helper()
		ok, err := n.DeleteTrigger(ctx, "j", tr, g)
		if err != nil {
			t.Fatal(err)
		}
		if ok == exists(tr.ID) {
			t.Fatalf("DeleteTrigger said %v, and the key exists: %v", ok, !ok)
		}
		return ok
	}

	t1 := put("t1")
	if del(t1, TriggerGuard{JobOff: true}) {
		t.Fatal("deleted as the job disabled, with no disable mark in etcd")
	}
	if _, err := cli.Put(ctx, keys.DisabledJob("j"), "x"); err != nil {
		t.Fatal(err)
	}
	if del(keyspace.Trigger{ID: "t1", Rev: t1.Rev - 1}, TriggerGuard{JobOff: true}) {
		t.Fatal("deleted a key that is not the trigger read")
	}
	if !del(t1, TriggerGuard{JobOff: true}) {
		t.Fatal("not deleted with the job's disable mark there")
	}

	t2 := put("t2")
	if _, err := cli.Put(ctx, keys.DisabledItem("j", 0), "x"); err != nil {
		t.Fatal(err)
	}
	if del(t2, TriggerGuard{ItemsOff: []int{0, 1}}) {
		t.Fatal("deleted while item 1, counted as disabled, is enabled in etcd")
	}
	if _, err := cli.Put(ctx, keys.DisabledItem("j", 1), "x"); err != nil {
		t.Fatal(err)
	}
	if !del(t2, TriggerGuard{ItemsOff: []int{0, 1}}) {
		t.Fatal("not deleted with both items' disable marks there")
	}

	t3 := put("t3")
	etcdtest.Eventually(t, 10*time.Second, "the job's registered definition", func() bool { v, _ := n.View("j"); return v.Generation != 0 })
	v, _ := n.View("j")
	if del(t3, TriggerGuard{Definition: v.Generation + 1}) {
		t.Fatal("deleted under a definition generation etcd does not have")
	}
	if !del(t3, TriggerGuard{Definition: v.Generation}) {
		t.Fatal("not deleted under the registered generation")
	}
	if !del(put("t4"), TriggerGuard{}) {
		t.Fatal("a served trigger (no guard) not deleted")
	}
	if _, err := n.DeleteTrigger(ctx, "j", put("t5"), TriggerGuard{ItemsOff: make([]int, MaxTriggerGuardItems+1)}); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("more compares than a Txn takes: err %v", err)
	}
}

// OnTrigger delivers a trigger's put and its deletion, with their
// revisions and the trigger's identity.
func TestOnTriggerDeliversPutsAndDeletions(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("j", 1)))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	if !n.hub.waitReady(ctx) {
		t.Fatal("hub not ready")
	}
	var mu sync.Mutex
	var got []keyspace.TriggerEvent
	defer n.OnTrigger("j", func(ev keyspace.TriggerEvent) {
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
	}, func() {})()
	p, err := cli.Put(ctx, keys.Trigger("j", "u1"), `{"id":"other","by":"me"}`)
	if err != nil {
		t.Fatal(err)
	}
	d, err := cli.Delete(ctx, keys.Trigger("j", "u1"))
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "both events", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 2 })
	put, gone := got[0], got[1]
	if put.ID != "u1" || put.Trigger == nil || put.Trigger.ID != "u1" || put.Trigger.By != "me" || put.Trigger.Rev != p.Header.Revision || put.Rev != p.Header.Revision {
		t.Errorf("put event %+v (trigger %+v), want u1 at %d", put, put.Trigger, p.Header.Revision)
	}
	if gone.ID != "u1" || gone.Trigger != nil || gone.Rev != d.Header.Revision {
		t.Errorf("delete event %+v, want u1 deleted at %d", gone, d.Header.Revision)
	}
}
