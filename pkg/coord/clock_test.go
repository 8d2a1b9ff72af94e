package coord

import (
	"context"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

func TestClockSkewAgainstEtcd(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	c, err := NewClockSkew(ClientOptions{Endpoints: []string{srv.Endpoint()}})
	if err != nil {
		t.Fatal(err)
	}
	skew, err := c.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Same host, same clock: within the Date header's resolution.
	if skew < -time.Second || skew > time.Second {
		t.Errorf("skew %s on one host", skew)
	}
	// A host whose clock runs 10s ahead sees etcd 10s behind.
	c.now = func() time.Time { return time.Now().Add(10 * time.Second) }
	skew, err = c.Measure(context.Background())
	if err != nil || skew > -9*time.Second || skew < -11*time.Second {
		t.Errorf("skew with a clock 10s ahead: %s %v", skew, err)
	}
	if s, ok := c.Skew(); !ok || s != skew {
		t.Errorf("Skew() = %s %v", s, ok)
	}
	bad, _ := NewClockSkew(ClientOptions{Endpoints: []string{"http://127.0.0.1:1"}})
	if _, err := bad.Measure(context.Background()); err == nil {
		t.Error("no error from an unreachable endpoint")
	}
}
