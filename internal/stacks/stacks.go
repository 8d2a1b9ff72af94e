// Package stacks looks at the goroutines of the running process, for tests
// that check what holds a goroutine (an idle job must not).
package stacks

import (
	"runtime"
	"strings"
)

// Count returns how many goroutines have a frame whose function name
// contains fn (a package path and function prefix such as
// "shardd/pkg/coord."). The goroutines of parallel tests still waiting to
// start (in testing.(*T).Parallel) are not counted: they hold nothing of
// the code under test.
func Count(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) && !strings.Contains(g, "testing.(*T).Parallel") {
			count++
		}
	}
	return count
}
