package coord

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a Node starts must be gone when Run returns and the test
// has closed its clients and servers. One is not ours to stop: the embedded
// etcd's rotating log (lumberjack) keeps a goroutine for the process's life,
// and etcd never closes its logger.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("gopkg.in/natefinch/lumberjack%2ev2.(*Logger).millRun"))
}
