package coord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Elections are concurrency.Election's: each candidate puts the key
// jobs/<job>/leader/<lease in hex> under its session's lease, and the
// candidate whose key is oldest (lowest CreateRevision) leads; the key's
// CreateRevision fences every write of the leader. What differs is the
// wait. concurrency.Election.Campaign waits behind the candidate ahead of
// it with an etcd watch of its own: one watcher per job on every instance
// that does not lead it (thousands with thousands of jobs). Here a
// candidate waits on the instance's one watch (the hub), and only for the
// keys its last look found older than its own:
//
//	put the key (or find it there, same lease) --rev--> look
//	look --its own key gone or changed (etcd #11051)--> put a new key, after a backoff
//	look --keys older than rev--> waiting for them (olderKeys)
//	look --none older--> elected: lead
//	waiting --the last of them deleted--> full look: the election and the
//	    leader's first read in one Txn; elected, it writes the map next
//	waiting --the deletion of any other key--> waiting (nothing to do)
//	waiting --a resync (events may be lost)--> look
//	waiting --the task stops, or the instance leaves--> delete the key (if still under the lease)
//
// So after the leader's key goes (it resigned, or its lease expired), the
// next candidate leads in two round trips: the full look and the map
// write. Keys put after a candidate's are younger and never make it wait,
// so the set it waits for only shrinks; an instance that dies wakes, for
// each job, only the candidate that was next behind it.
//
// The steps are jobTask.campaign's (task.go); the task holds no goroutine
// while it waits.
//
// Instances of older versions, campaigning with concurrency.Election on the
// same keys, agree on the leader: it is the same rule.

// candidateKey is one candidate's election key, as a look found it.
type candidateKey struct {
	key     string
	id      string // the value: the instance's id
	created int64  // CreateRevision: the candidate's place in line
	lease   clientv3.LeaseID
}

// candidateKeys reads kvs, the keys under an election prefix, oldest first.
func candidateKeys(kvs []*mvccpb.KeyValue) []candidateKey {
	out := make([]candidateKey, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, candidateKey{key: string(kv.Key), id: string(kv.Value), created: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].created < out[j].created })
	return out
}

// errStaleCandidate says a candidate's own key is not there as it put it:
// its lease expired (concurrency.Election.Campaign can win after that,
// etcd #11051) or someone deleted it.
var errStaleCandidate = errors.New("coord: the candidate's election key is gone or not ours")

// judgeElection judges the candidate whose key (key, rev) is under lease
// among the keys a look found: the keys older than it, for which it must
// wait (none: it leads), or errStaleCandidate.
func judgeElection(found []candidateKey, key string, rev int64, lease clientv3.LeaseID) (older []string, err error) {
	own := false
	for _, c := range found {
		switch {
		case c.key == key:
			own = c.created == rev && c.lease == lease
		case c.created < rev:
			older = append(older, c.key)
		}
	}
	if !own {
		return nil, fmt.Errorf("%w: %s", errStaleCandidate, key)
	}
	return older, nil
}

// lookElection reads the candidate keys under prefix created at or before
// rev: the ones ahead of the candidate whose key was created at rev, and
// its own.
func (n *Node) lookElection(ctx context.Context, prefix string, rev int64) ([]candidateKey, error) {
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Get(gctx, prefix, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev))
	if err != nil {
		return nil, err
	}
	return candidateKeys(resp.Kvs), nil
}

// olderKeys is what a waiting candidate waits for: the candidate keys older
// than its own that its last look found, less those deleted since. The
// hub's callback reads it while the task's step writes it.
type olderKeys struct {
	mu    sync.Mutex
	known bool     // false before a look has answered, and while one is on its way
	keys  []string // when known: those still there
}

// forget is called as a look begins: until it answers, every deletion
// under the prefix wakes the candidate (it may be of a key the look finds).
func (o *olderKeys) forget() {
	o.mu.Lock()
	o.known, o.keys = false, nil
	o.mu.Unlock()
}

// set records the older keys a look found.
func (o *olderKeys) set(keys []string) {
	o.mu.Lock()
	o.known, o.keys = true, keys
	o.mu.Unlock()
}

// deleted notes the deletion of key under the prefix and reports whether it
// should wake the candidate: when no look has answered, or when key was the
// last older one.
func (o *olderKeys) deleted(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.known {
		return true
	}
	i := slices.Index(o.keys, key)
	if i < 0 {
		return false
	}
	o.keys = slices.Delete(o.keys, i, i+1)
	return len(o.keys) == 0
}

// cleared reports whether every older key the last look found has been
// deleted since: the candidate is most likely the leader now.
func (o *olderKeys) cleared() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.known && len(o.keys) == 0
}

// withdraw deletes s's candidate key for job, if it is still under s's
// lease, once a campaign is given up; one try, bounded (the lease's end
// removes it anyway). The key's name is the lease's, so it is found even
// when the put's reply was lost.
func (n *Node) withdraw(s *session, job string) {
	key := n.candidateKey(s, job)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), time.Second)
	defer cancel()
	n.opts.Client.Txn(dctx).If(clientv3.Compare(clientv3.LeaseValue(key), "=", s.lease)).Then(clientv3.OpDelete(key)).Commit()
}

// candidateKey is s's election key for job: jobs/<job>/leader/<lease in hex>.
func (n *Node) candidateKey(s *session, job string) string {
	return fmt.Sprintf("%s%x", n.keys.Leader(job), s.lease)
}
