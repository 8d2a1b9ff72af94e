package runlog

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkCreateDuringSweep: how long a run's log takes to create and to
// close while a sweep goes over 20,000 logs of 100 jobs, from a store that
// has not loaded them yet (shardd's first sweep, at start). Each trial is
// one sweep; runs' logs are created and closed back to back until it
// ends. Reported: the sweep's duration, Create's p50, p99 and maximum, and
// Close's maximum, over every trial.
func BenchmarkCreateDuringSweep(b *testing.B) {
	dir := b.TempDir()
	const jobs, perJob = 100, 200
	for j := range jobs {
		jd := filepath.Join(dir, "job"+strconv.Itoa(j))
		if err := os.MkdirAll(jd, 0o700); err != nil {
			b.Fatal(err)
		}
		for i := range perJob {
			if err := os.WriteFile(filepath.Join(jd, strconv.Itoa(i+1)+"-0.log"), []byte("x\n"), 0o600); err != nil {
				b.Fatal(err)
			}
		}
	}
	var creates, closes []time.Duration
	var sweeps time.Duration
	fence := int64(0)
	b.ResetTimer()
	for range b.N {
		s, err := New(dir)
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan time.Duration)
		go func() {
			start := time.Now()
			s.Sweep(func(string) (Retention, bool) { return Retention{}, false })
			done <- time.Since(start)
		}()
	sweeping:
		for {
			select {
			case d := <-done:
				sweeps += d
				break sweeping
			default:
			}
			fence++
			start := time.Now()
			l, err := s.Create(Header{Job: "hot", Fence: fence}, Retention{})
			creates = append(creates, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			start = time.Now()
			l.Close("")
			closes = append(closes, time.Since(start))
		}
		os.RemoveAll(filepath.Join(dir, "hot"))
		s.Close()
	}
	b.StopTimer()
	slices.Sort(creates)
	slices.Sort(closes)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(sweeps/time.Duration(b.N)), "sweep-ms")
	b.ReportMetric(ms(creates[len(creates)/2]), "p50-ms")
	b.ReportMetric(ms(creates[len(creates)*99/100]), "p99-ms")
	b.ReportMetric(ms(creates[len(creates)-1]), "max-ms")
	b.ReportMetric(ms(closes[len(closes)-1]), "close-max-ms")
}
