package coord

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Elections are concurrency.Election's: each candidate puts the key
// jobs/<job>/leader/<lease in hex> under its session's lease, and the
// candidate whose key is oldest (lowest CreateRevision) leads; the key's
// CreateRevision fences every write of the leader. What differs is the
// wait. concurrency.Election.Campaign waits behind the candidate ahead of
// it with an etcd watch of its own: one watcher per job on every instance
// that does not lead it (thousands with thousands of jobs). Here a
// candidate waits on the instance's one watch (the hub): a deletion under
// the job's election prefix, or a resync, wakes it to look again.
//
//	put the key (or find it there, same lease) --rev--> waiting
//	waiting --no key older than rev--> elected: checkElected (etcd #11051), lead
//	waiting --a deletion under the prefix, a resync--> look again
//	waiting --the task stops, or the instance leaves--> delete the key (if still under the lease)
//
// The steps are jobTask.campaign's (task.go); the task holds no goroutine
// while it waits.
//
// Instances of older versions, campaigning with concurrency.Election on the
// same keys, agree on the leader: it is the same rule.

// olderCandidates reports whether a candidate key under prefix is older
// than rev.
func (n *Node) olderCandidates(ctx context.Context, prefix string, rev int64) (bool, error) {
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	// Not WithCountOnly: etcd counts the range before the revision filter.
	resp, err := n.txns.Get(gctx, prefix, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1), clientv3.WithKeysOnly())...)
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) > 0, nil
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

// checkElected verifies that s is up and the election key e holds is still
// there, created at e.Rev() under s's lease.
func (n *Node) checkElected(ctx context.Context, s *session, e *concurrency.Election) error {
	if s.ctx.Err() != nil {
		return s.Err()
	}
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Get(gctx, e.Key())
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != e.Rev() || clientv3.LeaseID(resp.Kvs[0].Lease) != s.lease {
		return fmt.Errorf("election key %s is gone or not ours", e.Key())
	}
	return nil
}
