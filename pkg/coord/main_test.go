package coord

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Node starts must be gone when Run returns and the test
// has closed its clients and servers (the embedded etcd's too: its log is
// its own, with no goroutine left behind).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
