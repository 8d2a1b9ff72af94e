package coord

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ClockSkew measures this host's clock against etcd's: etcd's HTTP
// endpoint answers with a Date header in its own clock. The Date header has
// a resolution of one second, so a measurement is good to about half a
// second plus half the round trip: enough for maxTimeDiffSeconds, which
// counts whole seconds.
type ClockSkew struct {
	endpoints []string
	client    *http.Client
	now       func() time.Time

	mu    sync.Mutex
	skew  time.Duration // etcd's clock minus ours
	known bool
}

// NewClockSkew measures against the etcd of o (its endpoints and TLS files).
func NewClockSkew(o ClientOptions) (*ClockSkew, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		t, err := tlsConfig(o)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = t
	}
	return &ClockSkew{endpoints: o.Endpoints, client: &http.Client{Transport: tr, Timeout: 5 * time.Second}, now: time.Now}, nil
}

// Measure asks one endpoint for its time and returns the skew (etcd minus here).
func (c *ClockSkew) Measure(ctx context.Context) (time.Duration, error) {
	var lastErr error
	for _, ep := range c.endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(ep, "/")+"/version", nil)
		if err != nil {
			lastErr = err
			continue
		}
		sent := c.now()
		resp, err := c.client.Do(req)
		got := c.now()
		if err != nil {
			lastErr = err
			continue
		}
		resp.Body.Close()
		date, err := http.ParseTime(resp.Header.Get("Date"))
		if err != nil {
			lastErr = fmt.Errorf("etcd %s: no usable Date header: %w", ep, err)
			continue
		}
		// The server's time was in [date, date+1s); compare its middle with ours.
		mid := sent.Add(got.Sub(sent) / 2)
		skew := date.Add(500 * time.Millisecond).Sub(mid)
		c.mu.Lock()
		c.skew, c.known = skew, true
		c.mu.Unlock()
		return skew, nil
	}
	return 0, fmt.Errorf("measure clock skew against etcd: %w", lastErr)
}

// Skew returns the last measured skew and whether there is one.
func (c *ClockSkew) Skew() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.skew, c.known
}

// Run measures every interval until ctx is done.
func (c *ClockSkew) Run(ctx context.Context, interval time.Duration) {
	for {
		c.Measure(ctx)
		if !sleep(ctx, interval) {
			return
		}
	}
}
