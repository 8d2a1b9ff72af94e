package coord

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardd/shardd/internal/etcdtest"
)

// The tests share one etcd (etcdtest.Shared) unless they need one of
// their own. Every goroutine a Node starts must be gone when Run returns
// and the test has closed its clients and servers (the embedded etcd's
// too: its log is its own, with no goroutine left behind).
func TestMain(m *testing.M) {
	code := etcdtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}
