//go:build race

package e2e

// raceEnabled: this test binary runs under the race detector, and so do
// the shardd binaries it builds.
const raceEnabled = true
