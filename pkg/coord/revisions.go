package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
)

// Revisions is what one etcd client has seen of its cluster's history: the
// cluster's id and the highest revision a linearizable answer carried. It
// sits in the client's gRPC interceptors (ClientOptions.Revisions), so it sees
// every answer before the code that asked.
//
// etcd's revision only rises and its cluster id never changes, until an
// operator restores a snapshot (the store goes back to the snapshot's
// revision, unless restored with --bump-revision), wipes the data (a new
// cluster at revision 1, often with the same id) or points the instance at
// another cluster. Everything shardd keeps across requests assumes the
// first two: the watch resumes after the last revision it delivered, the
// item cache and the views keep the newest value by revision, fences are
// claim revisions. So the moment an answer shows the history went back,
// Revisions refuses it, and every answer after it, to the code that asked
// (ErrRewound), until the node has recovered (Node.recoverRewind):
//
//	tracking --answer with a lower revision, another cluster id, or a key
//	     ^      whose revision went back (noteKeyRevision)--> rewound
//	     |                                                      |
//	     +---- recovered: etcd's revision passed every one seen; +
//	           the node dropped its views and caches, repaired item
//	           records from what it knew, and starts a new session
//
// Which answers prove it. A linearizable answer (a write, a Txn, a
// non-serializable Range, a lease grant or revoke) carries a revision at
// least that of every write acknowledged before the request was sent, by
// any member: so an answer below the highest revision seen before its
// request was sent (not before its answer came: requests overlap) cannot
// come from the same history. Serializable reads and stream headers (watch,
// keepalive) may come from a lagging member and are checked for the
// cluster id only.
type Revisions struct {
	now func() time.Time

	mu      sync.Mutex
	cluster uint64 // 0 until the first answer
	high    int64  // highest revision seen in a linearizable answer
	rewound *RewindError
	changed chan struct{} // closed and replaced when rewound is set
	noSpace *NoSpaceError // the last write was refused for etcd's NOSPACE alarm
	// onNoSpace, if set, is called (without h.mu) when noSpace is set or
	// cleared.
	onNoSpace func(*NoSpaceError)
	// onWatchStream, if set, is called (and must not block) when the
	// client opens a watch stream: after a reconnect (etcd restarted,
	// restored), the watch resumes silently at a revision etcd may no longer
	// have; a linearizable read then is checked against the history.
	onWatchStream func()
}

// NewRevisions returns an empty Revisions.
func NewRevisions() *Revisions {
	return &Revisions{now: time.Now, changed: make(chan struct{})}
}

// ErrRewound is the cause of every refusal while etcd's history is known to
// have gone back (see Revisions).
var ErrRewound = errors.New("coord: etcd went back in time (restored from a snapshot, wiped, or another cluster)")

// RewindError says what showed that etcd's history went back.
type RewindError struct {
	At time.Time
	// Seen is the revision of the history that went that showed it: the
	// highest seen before the answer (Got its revision), or the revision
	// Key had (Got the one it has, 0: gone).
	Seen, Got int64
	// SeenCluster and GotCluster differ when another cluster answered.
	SeenCluster, GotCluster uint64
	// Key, when set, is a key whose revision went back from Seen to Got.
	Key string
	// By, when set, is the instance that saw it and said so (its rewind
	// record), Reason what it saw.
	By, Reason string
}

func (e *RewindError) Error() string {
	switch {
	case e.By != "":
		return fmt.Sprintf("%v: instance %s saw it (%s)", ErrRewound, e.By, e.Reason)
	case e.SeenCluster != e.GotCluster:
		return fmt.Sprintf("%v: etcd cluster %x answers where cluster %x did", ErrRewound, e.GotCluster, e.SeenCluster)
	case e.Key != "" && e.Got == 0:
		return fmt.Sprintf("%v: key %s, seen at revision %d, is gone", ErrRewound, e.Key, e.Seen)
	case e.Key != "":
		return fmt.Sprintf("%v: key %s has revision %d, which was %d", ErrRewound, e.Key, e.Got, e.Seen)
	default:
		return fmt.Sprintf("%v: etcd answered at revision %d after revision %d", ErrRewound, e.Got, e.Seen)
	}
}

func (e *RewindError) Unwrap() error { return ErrRewound }

// NoSpaceError says that etcd refused a write for its NOSPACE alarm: no
// outcome, claim or registration can be written until an operator frees
// space (compact, defragment, disarm).
type NoSpaceError struct {
	Since time.Time
}

func (e *NoSpaceError) Error() string {
	return "etcd alarm NOSPACE since " + e.Since.Format(time.RFC3339) +
		": etcd refuses every write (database space exceeded); no run starts or is recorded until an operator compacts, defragments and disarms it"
}

// clearNoSpace forgets the NOSPACE alarm: etcd no longer lists it.
func (h *Revisions) clearNoSpace() {
	h.mu.Lock()
	was, on := h.noSpace, h.onNoSpace
	h.noSpace = nil
	h.mu.Unlock()
	if was != nil && on != nil {
		on(nil)
	}
}

// Rewound returns what showed etcd went back, nil while it has not.
func (h *Revisions) Rewound() *RewindError {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rewound
}

// NoSpace returns etcd's NOSPACE alarm as the last write saw it, nil if
// that write went through.
func (h *Revisions) NoSpace() *NoSpaceError {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.noSpace
}

// Highest is the highest revision seen.
func (h *Revisions) Highest() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.high
}

// sawCommitted records that revision rev was committed: a revision the
// jobs watch delivered (an event's, or a progress notification's). A
// linearizable answer to a request sent after it carries rev at least.
func (h *Revisions) sawCommitted(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rewound == nil {
		h.high = max(h.high, rev)
	}
}

// changes returns a channel closed the next time the history is found
// rewound.
func (h *Revisions) changes() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// rewind records e, unless a rewind is recorded already. h.mu is held.
func (h *Revisions) rewindLocked(e *RewindError) *RewindError {
	if h.rewound != nil {
		return h.rewound
	}
	e.At = h.now()
	h.rewound = e
	close(h.changed)
	h.changed = make(chan struct{})
	return e
}

// noteKeyRevision reports that key, read in an answer at revision readRev,
// has revision got where an answer no later than readRev showed it at seen:
// a key's revision only rises, so the history went back. It returns the
// rewind.
func (h *Revisions) noteKeyRevision(key string, seen, got int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rewindLocked(&RewindError{Seen: seen, Got: got, Key: key, SeenCluster: h.cluster, GotCluster: h.cluster})
}

// noteReport records that another instance saw etcd go back (its rewind
// record rec): this instance's state may be of the history that went too.
func (h *Revisions) noteReport(rec keyspace.RewindRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	by := rec.By // a report passed on names the first to see it
	if by == "" {
		by = rec.Instance
	}
	h.rewindLocked(&RewindError{By: by, Reason: rec.Reason, Seen: rec.Seen, Got: rec.Revision, SeenCluster: h.cluster, GotCluster: h.cluster})
}

// recovered ends a rewind once the node has recovered from it: etcd's
// revision is rev (above every revision seen) and its cluster id cluster.
func (h *Revisions) recovered(cluster uint64, rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rewound = nil
	h.cluster = cluster
	h.high = max(h.high, rev)
}

// recoveringKey marks the requests of a recovery: let through while rewound,
// and not checked against the revisions of the history that went.
type recoveringKey struct{}

func recovering(ctx context.Context) context.Context {
	return context.WithValue(ctx, recoveringKey{}, true)
}

func isRecovering(ctx context.Context) bool { return ctx.Value(recoveringKey{}) != nil }

// headed is every etcd answer with a header.
type headed interface {
	GetHeader() *etcdserverpb.ResponseHeader
}

// linearizable reports whether an answer to req carries a revision no lower
// than that of any write acknowledged before req was sent.
func linearizable(req any) bool {
	switch r := req.(type) {
	case *etcdserverpb.RangeRequest:
		return !r.Serializable
	case *etcdserverpb.TxnRequest:
		return !txnSerializable(r)
	case *etcdserverpb.PutRequest, *etcdserverpb.DeleteRangeRequest,
		*etcdserverpb.LeaseGrantRequest, *etcdserverpb.LeaseRevokeRequest:
		return true
	}
	return false
}

// txnSerializable mirrors etcd's rule: a Txn whose every operation is a
// serializable Range is served from the member's own store.
func txnSerializable(r *etcdserverpb.TxnRequest) bool {
	for _, ops := range [][]*etcdserverpb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			rr := op.GetRequestRange()
			if rr == nil || !rr.Serializable {
				return false
			}
		}
	}
	return true
}

// writes reports whether req asks etcd to write, and whether it costs
// quota (a put, a lease): under the NOSPACE alarm etcd refuses those and
// lets deletions through, so only their success says the alarm is gone.
func writes(req any) (write, quota bool) {
	switch r := req.(type) {
	case *etcdserverpb.PutRequest, *etcdserverpb.LeaseGrantRequest:
		return true, true
	case *etcdserverpb.DeleteRangeRequest:
		return true, false
	case *etcdserverpb.TxnRequest:
		for _, ops := range [][]*etcdserverpb.RequestOp{r.Success, r.Failure} {
			for _, op := range ops {
				switch {
				case op.GetRequestPut() != nil:
					return true, true
				case op.GetRequestDeleteRange() != nil:
					write = true
				}
			}
		}
		return write, false
	}
	return false, false
}

// observe checks an answer's header against the history seen before its
// request was sent (floor) and records it. It returns the rewind it shows
// or is in, nil if the answer may be used.
func (h *Revisions) observe(ctx context.Context, hdr *etcdserverpb.ResponseHeader, floor int64, lin bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if isRecovering(ctx) {
		return nil
	}
	if h.rewound != nil {
		return h.rewound
	}
	if hdr == nil {
		return nil
	}
	if h.cluster != 0 && hdr.ClusterId != 0 && hdr.ClusterId != h.cluster {
		return h.rewindLocked(&RewindError{Seen: h.high, Got: hdr.Revision, SeenCluster: h.cluster, GotCluster: hdr.ClusterId})
	}
	if h.cluster == 0 {
		h.cluster = hdr.ClusterId
	}
	if !lin {
		return nil
	}
	if hdr.Revision < floor {
		return h.rewindLocked(&RewindError{Seen: floor, Got: hdr.Revision, SeenCluster: h.cluster, GotCluster: hdr.ClusterId})
	}
	h.high = max(h.high, hdr.Revision)
	return nil
}

// refusal is the error a request gets while the history is rewound, nil
// when it may go.
func (h *Revisions) refusal(ctx context.Context) (floor int64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rewound != nil && !isRecovering(ctx) {
		return 0, h.rewound
	}
	return h.high, nil
}

// noteWrite records what a write's answer says of etcd's NOSPACE alarm
// (quota: it was a write that costs quota).
func (h *Revisions) noteWrite(err error, quota bool) {
	h.mu.Lock()
	was := h.noSpace
	switch {
	case err == nil && quota:
		h.noSpace = nil
	case errors.Is(rpctypes.Error(err), rpctypes.ErrNoSpace):
		if h.noSpace == nil {
			h.noSpace = &NoSpaceError{Since: h.now()}
		}
	}
	now, on := h.noSpace, h.onNoSpace
	h.mu.Unlock()
	if on != nil && (was == nil) != (now == nil) {
		on(now)
	}
}

// unary is the client's unary interceptor.
func (h *Revisions) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	floor, err := h.refusal(ctx)
	if err != nil {
		return err
	}
	err = invoker(ctx, method, req, reply, cc, opts...)
	if write, quota := writes(req); write {
		h.noteWrite(err, quota)
	}
	if err != nil {
		return err
	}
	if r, ok := reply.(headed); ok {
		return h.observe(ctx, r.GetHeader(), floor, linearizable(req))
	}
	return nil
}

// stream is the client's stream interceptor: watches and keepalives are
// checked for the cluster id, and refused while rewound.
func (h *Revisions) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if _, err := h.refusal(ctx); err != nil {
		return nil, err
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	if methodName(method) == "Watch" {
		h.mu.Lock()
		probe := h.onWatchStream
		h.mu.Unlock()
		if probe != nil {
			probe() // must not block
		}
	}
	return &historyStream{ClientStream: cs, h: h, ctx: ctx}, nil
}

type historyStream struct {
	grpc.ClientStream
	h   *Revisions
	ctx context.Context
}

func (s *historyStream) RecvMsg(m any) error {
	if err := s.ClientStream.RecvMsg(m); err != nil {
		return err
	}
	var hdr *etcdserverpb.ResponseHeader
	if r, ok := m.(headed); ok {
		hdr = r.GetHeader()
	}
	return s.h.observe(s.ctx, hdr, 0, false)
}

// interceptors returns the dial options that put h in a client.
func (h *Revisions) interceptors() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(h.unary), grpc.WithChainStreamInterceptor(h.stream)}
}

// methodName is a gRPC method's last segment (Range, Txn, LeaseGrant, ...).
func methodName(method string) string { return method[strings.LastIndexByte(method, '/')+1:] }
