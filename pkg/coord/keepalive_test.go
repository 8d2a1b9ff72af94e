package coord

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
)

// A keepalive that times out is retried at once, each attempt capped by the
// time left before the fence deadline: a 1.2s outage does not fence a TTL 3s
// session whose lease had >0.9s left when etcd came back. (The loop once
// waited a whole interval after a failed attempt, past the deadline.)
func TestOneSlowKeepaliveDoesNotFence(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cli := srv.Client("http://" + p.Addr())
	ttl := 3 * time.Second
	s, err := openSession(context.Background(), cli, ttl, time.Now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close(false)
	d0 := s.Deadline()
	etcdtest.Eventually(t, 5*time.Second, "a keepalive", func() bool { return s.Deadline().After(d0) })
	acked := s.Deadline() // = sent + 2.4s
	sent := acked.Add(-(ttl - fenceMargin(ttl)))
	time.Sleep(time.Until(sent.Add(900 * time.Millisecond)))
	p.Blackhole()
	time.Sleep(time.Until(sent.Add(2100 * time.Millisecond)))
	p.Restore()
	t.Logf("outage %s..%s after the last acked send; fence deadline at +%s", "0.9s", "2.1s", ttl-fenceMargin(ttl))
	select {
	case <-s.Fenced():
		t.Errorf("fenced at +%s after a 1.2s outage (err %v)", time.Since(sent).Round(10*time.Millisecond), s.Err())
	case <-time.After(3 * time.Second):
		t.Logf("survived")
	}
}
