package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrFenced is the cause of a session's context when the session fenced
// itself: etcd did not acknowledge a keepalive in time, so the lease may
// expire on the server at any moment.
var ErrFenced = errors.New("coord: session fenced: no keepalive acknowledged in time")

// errLeaseGone is the cause when etcd said the lease no longer exists.
var errLeaseGone = errors.New("coord: session lease expired or revoked")

// MinTTL is the shortest session TTL shardd accepts.
const MinTTL = 2 * time.Second

// session is one etcd lease kept alive by its own loop. It knows when it
// sent the last keepalive that etcd acknowledged: the lease cannot expire on
// the server before that time plus the TTL. It cancels its context (fences
// itself) a margin before that, without waiting for the client library's
// Session.Done(), which counts from the keepalive's reply and so fires late.
type session struct {
	cli    *clientv3.Client
	lease  clientv3.LeaseID
	ttl    time.Duration
	margin time.Duration
	now    func() time.Time
	log    *slog.Logger

	ctx    context.Context // cancelled with ErrFenced, errLeaseGone or on close
	cancel context.CancelCauseFunc
	conc   *concurrency.Session // for elections; shares the lease

	mu       sync.Mutex
	deadline time.Time   // fence time: last acknowledged send + ttl - margin
	fence    *time.Timer // fires at deadline
	wg       sync.WaitGroup
}

// fenceMargin is how long before the earliest possible server-side expiry
// the session fences itself: time to stop leading and kill running work.
func fenceMargin(ttl time.Duration) time.Duration {
	return max(ttl/5, 400*time.Millisecond)
}

// openSession grants a lease of ttl and starts keeping it alive. The
// session's context is derived from ctx.
func openSession(ctx context.Context, cli *clientv3.Client, ttl time.Duration, now func() time.Time, log *slog.Logger) (*session, error) {
	sent := now()
	gctx, cancel := context.WithTimeout(ctx, ttl)
	resp, err := cli.Grant(gctx, int64(ttl/time.Second))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("grant lease: %w", err)
	}
	s := &session{cli: cli, lease: resp.ID, ttl: ttl, margin: fenceMargin(ttl), now: now, log: log}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	s.deadline = sent.Add(s.grantedTTL(resp.TTL) - s.margin)
	s.fence = time.AfterFunc(s.deadline.Sub(now()), func() { s.cancel(ErrFenced) })
	s.conc, err = concurrency.NewSession(cli, concurrency.WithLease(resp.ID), concurrency.WithContext(s.ctx))
	if err != nil {
		s.fence.Stop()
		s.cancel(err)
		return nil, fmt.Errorf("start session on lease %x: %w", resp.ID, err)
	}
	s.wg.Add(1)
	go s.keepAlive()
	return s, nil
}

// grantedTTL is the TTL etcd says it gave, capped by the one asked for.
func (s *session) grantedTTL(seconds int64) time.Duration {
	return min(time.Duration(seconds)*time.Second, s.ttl)
}

// Fenced is closed when the session can no longer be trusted to hold its
// lease, or was closed.
func (s *session) Fenced() <-chan struct{} { return s.ctx.Done() }

// Err returns why the session ended, or nil while it is up.
func (s *session) Err() error { return context.Cause(s.ctx) }

// Deadline returns the time at which the session will fence itself unless a
// newer keepalive is acknowledged.
func (s *session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

func (s *session) keepAlive() {
	defer s.wg.Done()
	interval := s.ttl / 3
	b := backoff{min: 100 * time.Millisecond, max: 500 * time.Millisecond}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		sent := s.now()
		// An attempt may take no longer than the time left before the fence
		// deadline: a keepalive acknowledged after it is of no use, and the
		// next attempt must still fit.
		ctx, cancel := context.WithTimeout(s.ctx, keepAliveTimeout(interval, s.Deadline().Sub(sent)))
		resp, err := s.cli.KeepAliveOnce(ctx, s.lease)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			s.extend(sent.Add(s.grantedTTL(resp.TTL) - s.margin))
			b.reset()
			t.Reset(interval)
			continue
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil:
			s.cancel(errLeaseGone)
			return
		case s.ctx.Err() == nil:
			s.log.Debug("keepalive failed; retrying", "lease", fmt.Sprintf("%x", s.lease), "fence_in", s.Deadline().Sub(s.now()).Round(time.Millisecond), "err", err)
		}
		// Retry promptly: one slow or failed attempt (an etcd leader
		// election) must not cost a whole interval when the deadline is near.
		t.Reset(b.next())
	}
}

// keepAliveTimeout bounds one keepalive attempt: at most interval, and no
// later than the time left before the fence deadline (but at least 100ms,
// so that a late attempt still has a chance).
func keepAliveTimeout(interval, left time.Duration) time.Duration {
	return max(min(interval, left), 100*time.Millisecond)
}

// extend moves the fence deadline to d, unless the session has fenced already.
func (s *session) extend(d time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil || !d.After(s.deadline) {
		return
	}
	if !s.fence.Stop() {
		return // fired: the session is fenced
	}
	s.deadline = d
	s.fence.Reset(d.Sub(s.now()))
}

// close stops keeping the lease alive and, if revoke is set, revokes it so
// that its keys go at once. It returns when the keepalive loop has exited.
func (s *session) close(revoke bool) error {
	s.fence.Stop()
	s.cancel(context.Canceled)
	s.wg.Wait()
	if !revoke {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(s.ttl, 3*time.Second))
	defer cancel()
	if _, err := s.cli.Revoke(ctx, s.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x: %w", s.lease, err)
	}
	return nil
}
