package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// ordersNode starts instance a with one job, orders, of items items, and
// waits for its membership.
func ordersNode(t *testing.T, items int) *testNode {
	t.Helper()
	n := startNode(t, etcdtest.Shared(t), "a", jobs(t, "jobs:\n"+job("orders", items)))
	etcdtest.Eventually(t, 10*time.Second, "a's membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
	return n
}

// claimsOf are the claims of items' fire of orders, on n's current read.
func claimsOf(t *testing.T, n *testNode, items int, fire time.Time) []Claim {
	t.Helper()
	read, err := n.ReadItems(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	var cs []Claim
	for item := range items {
		cs = append(cs, Claim{Job: "orders", Item: item, Fire: fire, Attempt: 1, Source: keyspace.SourceNormal, Prev: read.Items[item], Sched: fire})
	}
	return cs
}

// A claim whose transaction ended with an unknown outcome is read back: if
// it applied, the caller gets its fence and runs it (else its running
// marker would hold the item for as long as the session lives); if it did
// not, the claim is lost and the caller decides again.
func TestClaimWithUnknownOutcomeIsReadBack(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	s, _ := n.sessionFor("orders")
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

	// Applied: a real claim, whose reply we pretend was lost.
	prev, err := n.ReadItem(ctx, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	c := Claim{Job: "orders", Item: 0, Fire: fire, Attempt: 1, Source: "NORMAL", Prev: prev}
	g, err := n.Claim(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.cli.Get(ctx, n.keys.Item("orders", 0))
	if err != nil {
		t.Fatal(err)
	}
	written := resp.Kvs[0].Value
	if fence, err := n.readBackClaim(ctx, s, c, written); err != nil || fence != g.Fence {
		t.Errorf("applied claim read back as fence %d, %v; want fence %d", fence, err, g.Fence)
	}

	// Not applied: the record there is not the one this claim would write.
	c1 := Claim{Job: "orders", Item: 1, Fire: fire, Attempt: 1, Source: "NORMAL"}
	if _, err := n.readBackClaim(ctx, s, c1, []byte(`{"never":"written"}`)); !errors.Is(err, ErrClaimLost) {
		t.Errorf("claim that never applied: err = %v, want ErrClaimLost", err)
	}
	// Once the run is complete the record says DONE and the marker is
	// gone: nothing there is this claim's any more.
	if err := n.Complete(ctx, g, Outcome{State: keyspace.StateDone, ExitCode: 0, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.readBackClaim(ctx, s, c, written); !errors.Is(err, ErrClaimLost) {
		t.Errorf("claim whose marker is gone: err = %v, want ErrClaimLost", err)
	}
}

// ClaimAll wins the claims of one job in one Txn, at one fence; when one
// item's guard fails, the others are still won, one by one.
func TestClaimAll(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 4)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	res := n.ClaimAll(ctx, claimsOf(t, n, 4, fire)) // one Txn: one fence for all
	for i, r := range res {
		if r.Err != nil || r.Grant.Fence != res[0].Grant.Fence {
			t.Fatalf("claim %d: %+v (first fence %d)", i, r, res[0].Grant.Fence)
		}
		if err := n.Complete(ctx, r.Grant, Outcome{State: keyspace.StateDone, Start: fire, End: fire}); err != nil {
			t.Fatal(err)
		}
	}

	// Item 2 changes between the read and the claims: the others are won.
	cs := claimsOf(t, n, 4, fire)
	for i := range cs {
		cs[i].Fire, cs[i].Sched = fire.Add(time.Minute), fire.Add(time.Minute)
	}
	if _, err := n.cli.Put(ctx, n.keys.RunningItem("orders", 2), "b"); err != nil {
		t.Fatal(err)
	}
	res = n.ClaimAll(ctx, cs)
	for i, r := range res {
		switch {
		case i == 2 && !errors.Is(r.Err, ErrClaimLost):
			t.Errorf("item 2, held by b: %+v, want ErrClaimLost", r)
		case i != 2 && (r.Err != nil || r.Grant == nil):
			t.Errorf("item %d: %+v, want won", i, r)
		}
	}
}

// Outcomes that come together are written together; one whose guard fails
// (its item was taken over) does not fail the others.
func TestCompletionsTogether(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 8)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	cs := claimsOf(t, n, 8, fire)
	res := n.ClaimAll(ctx, cs)
	// Item 5 is taken over meanwhile.
	if _, err := n.cli.Put(ctx, n.keys.Item("orders", 5), `{"job":"orders","item":5,"state":"RUNNING","instance":"b"}`); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i, r := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.Complete(ctx, r.Grant, Outcome{State: keyspace.StateDone, Start: fire, End: fire})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if (i == 5) != errors.Is(err, ErrClaimLost) || (i != 5 && err != nil) {
			t.Errorf("item %d: %v", i, err)
		}
	}
	for item := range 8 {
		st, _ := n.ReadItem(ctx, "orders", item)
		if item != 5 && (st.Record.State != keyspace.StateDone || st.RunningBy != "") {
			t.Errorf("item %d: %+v", item, st)
		}
	}
}

// A batch of outcomes whose guards hold is one Txn: one revision.
func TestCompletionsBatchIsOneTxn(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 4)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	cs := claimsOf(t, n, 4, fire)
	var batch []*completion
	for _, r := range n.ClaimAll(ctx, cs) {
		rec := r.Grant.record
		rec.State = keyspace.StateDone
		batch = append(batch, &completion{rec: rec, fence: r.Grant.Fence, done: make(chan error, 1)})
	}
	n.writeOutcomes(batch)
	for i, r := range batch {
		if err := <-r.done; err != nil {
			t.Errorf("outcome %d: %v", i, err)
		}
	}
	// One Txn: the four records were written at one revision (the
	// cluster's revision may move meanwhile: the node's own leader writes).
	resp, err := n.cli.Get(ctx, n.keys.Items("orders"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := map[int64]bool{}
	for _, kv := range resp.Kvs {
		revs[kv.ModRevision] = true
	}
	if len(resp.Kvs) != 4 || len(revs) != 1 {
		t.Errorf("4 outcomes: %d records at %d revisions, want 4 at 1 (one Txn)", len(resp.Kvs), len(revs))
	}
}

// The runs of one claim Txn (siblings) that end a moment apart have their
// outcomes written in one Txn: the first waits for the others (at most
// siblingLinger). Without it, each was written on its own (an outcome Txn
// per execution in make bench).
func TestSiblingOutcomesAreOneTxn(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	res := n.ClaimAll(ctx, claimsOf(t, n, 2, fire))
	if res[0].Grant == nil || res[1].Grant == nil || res[0].Grant.Fence != res[1].Grant.Fence {
		t.Fatalf("claims: %+v", res)
	}
	errs := make(chan error, 2)
	for i, r := range res {
		go func() {
			time.Sleep(time.Duration(i) * time.Millisecond) // the second run ends 1 ms after the first
			errs <- n.Complete(ctx, r.Grant, Outcome{State: keyspace.StateDone, Start: fire, End: fire})
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	resp, err := n.cli.Get(ctx, n.keys.Items("orders"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 2 || resp.Kvs[0].ModRevision != resp.Kvs[1].ModRevision {
		t.Errorf("2 sibling outcomes: %d records, at revisions %d and %d; want one Txn", len(resp.Kvs), resp.Kvs[0].ModRevision, resp.Kvs[len(resp.Kvs)-1].ModRevision)
	}
	// A lone outcome does not wait for siblings it does not have.
	res = n.ClaimAll(ctx, claimsOf(t, n, 1, fire.Add(time.Minute)))
	if res[0].Grant == nil {
		t.Fatalf("claim: %+v", res[0])
	}
	n.completions.mu.Lock()
	tracked := len(n.completions.siblings)
	n.completions.mu.Unlock()
	if tracked != 0 {
		t.Errorf("%d fences tracked after every sibling reported; want 0", tracked)
	}
}

// Item states come from the watch once a job's cache is filled: this
// instance's own claims and outcomes show in what it reads next, another
// writer's changes too, and reading needs no request to etcd.
func TestItemCache(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	read := func() keyspace.JobItems {
		t.Helper()
		items, err := n.ReadItems(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		return items
	}
	read() // subscribes the cache and fills it
	g, err := n.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: fire, Attempt: 1, Source: keyspace.SourceNormal, Prev: read().Items[0], Sched: fire})
	if err != nil {
		t.Fatal(err)
	}
	if st := read().Items[0]; st.Record == nil || st.Record.State != keyspace.StateRunning || !st.RunningMine || st.Rev != g.Fence {
		t.Fatalf("own claim not in the next read: %+v", st)
	}
	if err := n.Complete(ctx, g, Outcome{State: keyspace.StateDone, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	if st := read().Items[0]; st.Record == nil || st.Record.State != keyspace.StateDone || st.RunningBy != "" {
		t.Fatalf("own outcome not in the next read: %+v", st)
	}
	// Another writer: b's marker on item 1, and an operator's disable mark.
	if _, err := n.cli.Put(ctx, n.keys.RunningItem("orders", 1), "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.cli.Put(ctx, n.keys.DisabledItem("orders", 0), ""); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "others' changes in the cache", func() bool {
		items := read()
		return items.Items[1].RunningBy == "b" && items.Items[0].Disabled
	})
	// With etcd out of reach the cache still answers, at once.
	n.proxy.Blackhole()
	defer n.proxy.Restore()
	start := time.Now()
	if st := read().Items[1]; st.RunningBy != "b" {
		t.Errorf("cached read: %+v", st)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a cached read took %s: it went to etcd", took)
	}
}

// A reader woken by an event sees that event in the cache: the hub
// delivers an event to its subscribers in no set order, and a reconcile
// woken by the first must not read the cache before the cache has it (a
// marker's deletion missed that way is a lost wake-up: the loop waits for
// a deletion that already came).
func TestItemCacheSeesTheEventThatWokeTheReader(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	if _, err := n.ReadItems(ctx, "orders"); err != nil { // subscribes the cache and fills it
		t.Fatal(err)
	}
	seen := make(chan keyspace.ItemState, 1)
	// The subscriber reads as a woken reconcile would, and waits a little
	// for its answer (the hub goes on delivering meanwhile only if the
	// read does not wait for it).
	cancel := n.hub.subscribe("orders", n.keys.Running("orders"), func(ev *clientv3.Event) {
		if ev.Type != clientv3.EventTypeDelete {
			return
		}
		done := make(chan keyspace.ItemState, 1)
		go func() {
			items, err := n.ReadItems(ctx, "orders")
			if err != nil {
				t.Error(err)
			}
			done <- items.Items[1]
		}()
		select {
		case st := <-done:
			seen <- st
		case <-time.After(50 * time.Millisecond):
			go func() { seen <- <-done }()
		}
	}, func() {})
	defer cancel()
	for i := range 20 {
		if _, err := n.cli.Put(ctx, n.keys.RunningItem("orders", 1), "b"); err != nil {
			t.Fatal(err)
		}
		etcdtest.Eventually(t, 5*time.Second, "b's marker in the cache", func() bool {
			items, err := n.ReadItems(ctx, "orders")
			return err == nil && items.Items[1].RunningBy == "b"
		})
		if _, err := n.cli.Delete(ctx, n.keys.RunningItem("orders", 1)); err != nil {
			t.Fatal(err)
		}
		if st := <-seen; st.RunningBy != "" {
			t.Fatalf("round %d: the reader woken by the marker's deletion still saw it: %+v", i, st)
		}
	}
}

// A read begun before the hub lost events (a compacted watch: resync) does
// not fill the cache: it may miss events the hub will never deliver.
func TestItemCacheNotFilledByAReadOlderThanAResync(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	if _, err := n.ReadItems(ctx, "orders"); err != nil { // subscribes the cache and fills it
		t.Fatal(err)
	}
	c := n.itemCacheOf("orders")
	n.hub.resyncAll()
	c.mu.Lock()
	gen, filled := c.gen, c.filled
	c.mu.Unlock()
	if filled {
		t.Fatal("cache still filled after a resync")
	}
	resp, err := n.cli.Txn(ctx).Then(
		clientv3.OpGet(n.keys.Items("orders"), clientv3.WithPrefix()),
		clientv3.OpGet(n.keys.Running("orders"), clientv3.WithPrefix()),
		clientv3.OpGet(n.keys.DisabledItems("orders"), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	n.hub.resyncAll() // events lost while the read was on its way
	c.fill(gen, resp)
	c.mu.Lock()
	filled = c.filled
	c.mu.Unlock()
	if filled {
		t.Fatal("a read begun before a resync filled the cache")
	}
	c.mu.Lock()
	gen = c.gen
	c.mu.Unlock()
	c.fill(gen, resp)
	if _, _, ok := n.cachedItems(ctx, "orders", c); !ok {
		t.Fatal("a read of the current generation did not fill the cache")
	}
}

// A record write (an outcome, a skip, a settle) whose outcome is unknown is
// read back: written is reported written, even when the caller's context
// ended with the request on its way (a graceful stop), so that the engine
// logs the policy it applied.
func TestFinishWithUnknownOutcomeIsReadBack(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	if err := n.Skip(ctx, Skip{Job: "orders", Item: 0, Fire: fire, Skipped: 1, Reason: keyspace.SkipTooOld}); err != nil {
		t.Fatal(err)
	}
	st, err := n.ReadItem(ctx, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, ops, err := n.finishTxn(*st.Record, st.Rev, false)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if !n.finishApplied(ended, *st.Record, ops[0]) {
		t.Error("a record written was read back as not written")
	}
	other := *st.Record
	other.End = other.End.Add(time.Nanosecond)
	_, ops, _ = n.finishTxn(other, st.Rev, false)
	if n.finishApplied(ctx, other, ops[0]) {
		t.Error("a record never written was read back as written")
	}
}

// An adopt refused because etcd's item is not the state it was asked on
// empties the job's item cache: the next decision reads etcd, instead of
// trying the same adopt again on the same cached state.
func TestFailedAdoptInvalidatesTheItemCache(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	if _, err := n.ReadItems(ctx, "orders"); err != nil { // subscribes the cache
		t.Fatal(err)
	}
	if _, err := n.ReadItems(ctx, "orders"); err != nil { // fills it
		t.Fatal(err)
	}
	c := n.itemCacheOf("orders")
	filled := func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.filled }
	if !filled() {
		t.Fatal("the item cache is not filled after two reads")
	}
	if _, err := n.Adopt(ctx, "orders", 0, keyspace.ItemState{Rev: 12345}); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("adopt of a state etcd does not have: %v, want ErrClaimLost", err)
	}
	if filled() {
		t.Error("the item cache still serves after a refused adopt")
	}
}

// The claims of many jobs due at the same instant share Txns (batch.go),
// each won under its own guards.
func TestClaimsOfManyJobsShareTxns(t *testing.T) {
	t.Parallel()
	const njobs = 30
	yaml := "jobs:\n"
	for i := range njobs {
		yaml += job(fmt.Sprintf("j%02d", i), 1)
	}
	n := startNode(t, etcdtest.Shared(t), "a", jobs(t, yaml))
	ctx := context.Background()
	fire := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	claims := make([]Claim, njobs)
	for i := range njobs {
		name := fmt.Sprintf("j%02d", i)
		etcdtest.Eventually(t, 10*time.Second, name+"'s membership", func() bool { s, m := n.sessionFor(name); return s != nil && m != 0 })
		prev, err := n.ReadItem(ctx, name, 0)
		if err != nil {
			t.Fatal(err)
		}
		claims[i] = Claim{Job: name, Item: 0, Fire: fire, Attempt: 1, Source: keyspace.SourceNormal, Prev: prev, Sched: fire}
	}
	// etcd is held while the claims come: the first few are on their
	// way, the others wait for them, as in a storm.
	n.proxy.Blackhole()
	before, asked := n.txns.commits.Load(), n.txns.requests.Load()
	grants := make([]*Grant, njobs)
	errs := make([]error, njobs)
	var wg sync.WaitGroup
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grants[i], errs[i] = n.Claim(ctx, c)
		}()
	}
	etcdtest.Eventually(t, 5*time.Second, "the claims to be asked", func() bool { return n.txns.requests.Load()-asked >= njobs })
	n.proxy.Restore()
	wg.Wait()
	txns := n.txns.commits.Load() - before
	fences := map[int64]bool{}
	for i := range njobs {
		if errs[i] != nil {
			t.Fatalf("claim of %s: %v", claims[i].Job, errs[i])
		}
		fences[grants[i].Fence] = true
		got, err := n.ReadItem(ctx, claims[i].Job, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.Record == nil || got.Record.State != keyspace.StateRunning || got.Rev != grants[i].Fence {
			t.Errorf("%s after its claim: %+v at revision %d, want RUNNING at its fence %d", claims[i].Job, got.Record, got.Rev, grants[i].Fence)
		}
	}
	// batchesInflight went alone; the rest in a Txn or two.
	if txns > batchesInflight+3 || len(fences) > batchesInflight+3 {
		t.Errorf("%d claims of %d jobs in %d Txns (%d fences): not batched", njobs, njobs, txns, len(fences))
	}
	t.Logf("%d claims in %d Txns, %d fences", njobs, txns, len(fences))
}

// Claims that serve a trigger have 3 guards each (record, marker, the
// trigger's CreateRevision): 50 of them are won in Txns etcd accepts. With
// 60 claims a Txn whatever their guards, 42 or more made a Txn of over 128
// Compares that etcd refused; the claims were read back, found lost, and
// made again, forever: a trigger of 42+ items on one instance never ran.
func TestClaimAllOfTriggerServingClaims(t *testing.T) {
	t.Parallel()
	const items = 50
	n := ordersNode(t, items)
	ctx := context.Background()
	put, err := n.cli.Put(ctx, n.keys.Trigger("orders", "t1"), `{}`)
	if err != nil {
		t.Fatal(err)
	}
	rev := put.Header.Revision
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	cs := claimsOf(t, n, items, fire)
	for i := range cs {
		cs[i].Source, cs[i].Trigger, cs[i].TriggerID = keyspace.SourceManual, rev, "t1"
	}
	won := 0
	var first error
	for _, r := range n.ClaimAll(ctx, cs) {
		if r.Err == nil {
			won++
		} else if first == nil {
			first = r.Err
		}
	}
	if won != items {
		t.Fatalf("%d of %d uncontested trigger claims won; first error: %v", won, items, first)
	}
}

// A claim Txn holds as many claims as etcd's 128 guards and writes allow.
func TestClaimChunkEnd(t *testing.T) {
	t.Parallel()
	param := func(cs []Claim, n int) []Claim {
		for i := range cs {
			cs[i].Param = strings.Repeat("p", n)
		}
		return cs
	}
	cutting := func(cs []Claim) []Claim {
		for i := range cs {
			cs[i].Prev.Record = &keyspace.ItemRecord{State: keyspace.StateRunning}
		}
		return cs
	}
	many := func(n int, trigger string) []Claim {
		cs := make([]Claim, n)
		for i := range cs {
			cs[i].TriggerID = trigger
		}
		return cs
	}
	for _, tc := range []struct {
		name   string
		claims []Claim
		from   int
		want   int
	}{
		{"none", nil, 0, 0},
		{"fewer than a Txn holds", many(10, ""), 0, 10},
		{"scheduled: 2 guards and 2 writes each, 2 shared guards", many(100, ""), 0, 63},
		{"the rest after the first Txn", many(100, ""), 63, 100},
		{"serving a trigger: 3 guards each", many(100, "t"), 0, 42},
		{"mixed", append(many(40, "t"), many(40, "")...), 0, 40 + 3},
		{"taking over from cut runs: 3 writes each", cutting(many(100, "")), 0, 42},
		{"16 KiB parameters: bounded by bytes", param(many(100, ""), 16<<10), 0, 10},
		{"one claim larger than the bound goes alone", param(many(3, ""), 1<<20), 0, 1},
	} {
		if got := claimChunkEnd(tc.claims, tc.from); got != tc.want {
			t.Errorf("%s: claimChunkEnd(%d claims, %d) = %d, want %d", tc.name, len(tc.claims), tc.from, got, tc.want)
		}
	}
}

// A claim that takes over from a cut run (its record still RUNNING, its
// running marker gone with its instance's lease) writes the cut run's
// record to the history, KILLED/lost under its own fence and slot, in the
// same Txn: without it the new claim's record replaced the cut run's, and
// etcd kept nothing of the run that began and was cut. Alone and in a
// Txn of many claims alike.
func TestAClaimOverACutRunRecordsTheCutRun(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 3)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	first := n.ClaimAll(ctx, claimsOf(t, n, 3, fire))
	for _, r := range first {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	cut := first[0].Grant.Fence
	// The instance dies: its running markers go with its lease (here, by
	// hand); the item records still say RUNNING.
	for item := range 3 {
		if _, err := n.cli.Delete(ctx, n.keys.RunningItem("orders", item)); err != nil {
			t.Fatal(err)
		}
	}
	again := claimsOf(t, n, 3, fire)
	for i := range again {
		again[i].Attempt, again[i].Source = 2, keyspace.SourceFailover
	}
	single := again[2]
	res := n.ClaimAll(ctx, again[:2]) // one Txn
	res = append(res, ClaimResult{})
	res[2].Grant, res[2].Err = n.Claim(ctx, single) // alone
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("failover claim %d: %v", i, r.Err)
		}
	}
	recs, err := n.History(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	byItem := map[int]keyspace.ItemRecord{}
	for _, rec := range recs {
		byItem[rec.Item] = rec
	}
	for item := range 3 {
		rec, ok := byItem[item]
		if !ok || rec.State != keyspace.StateKilled || rec.Reason != keyspace.ReasonLost || rec.Fence != cut || rec.Attempt != 1 ||
			!strings.Contains(rec.Error, "run again as attempt 2 (FAILOVER)") {
			t.Errorf("item %d's history: %+v (present %v); want the cut run, KILLED/lost, fence %d, attempt 1", item, rec, ok, cut)
		}
	}
	// The re-runs' outcomes land in the next slots: the cut run's record stays.
	for _, r := range res {
		if err := n.Complete(ctx, r.Grant, Outcome{State: keyspace.StateDone, Start: fire, End: fire}); err != nil {
			t.Fatal(err)
		}
	}
	recs, _ = n.History(ctx, "orders")
	if len(recs) != 6 {
		t.Errorf("%d history records, want 6: each item's cut run and its re-run", len(recs))
	}
}

// A claim made ahead of its work records the work's start (StartAt), not
// the claim's time: no RUNNING record shows a start before its fire (a new
// user's history showed START a second before FIRE). A claim without one
// records its own time.
func TestClaimAheadRecordsItsStart(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	fire := time.Now().Add(3 * time.Second).Truncate(time.Second)
	cs := claimsOf(t, n, 2, fire)
	cs[0].StartAt = fire.Add(1500 * time.Millisecond) // a jitter offset
	before := time.Now()
	for _, c := range cs {
		if _, err := n.Claim(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	read, err := n.ReadItems(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := read.Items[0].Record.Start; !got.Equal(cs[0].StartAt.UTC()) {
		t.Errorf("item 0, claimed ahead: record start %s, want its StartAt %s", got.Format(time.RFC3339Nano), cs[0].StartAt.Format(time.RFC3339Nano))
	}
	if got := read.Items[1].Record.Start; got.Before(before.Add(-time.Second)) || got.After(time.Now()) {
		t.Errorf("item 1, claimed for now: record start %s, want the claim's time", got.Format(time.RFC3339Nano))
	}
}
