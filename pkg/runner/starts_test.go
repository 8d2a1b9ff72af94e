package runner

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// Starts gives its slots to the earliest fire first, never more than its
// bound at once, and a waiter whose ctx ends leaves the line.
func TestStartsInFireOrder(t *testing.T) {
	t.Parallel()
	s := NewStarts(1)
	ctx := context.Background()
	hold, err := s.take(ctx, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	fires := []int64{30, 10, 20, 10, 40}
	var (
		mu    sync.Mutex
		order []int64
		wg    sync.WaitGroup
	)
	gone, leave := context.WithCancelCause(ctx)
	for i, f := range fires {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ctx
			if i == 4 {
				c = gone
			}
			done, err := s.take(c, time.Unix(f, 0))
			if err != nil {
				mu.Lock()
				order = append(order, -f)
				mu.Unlock()
				return
			}
			mu.Lock()
			order = append(order, f)
			mu.Unlock()
			done()
			done() // idempotent
		}()
	}
	for s.waitingLen() < len(fires) {
		time.Sleep(time.Millisecond)
	}
	leave(errors.New("killed"))
	for s.waitingLen() > len(fires)-1 {
		time.Sleep(time.Millisecond)
	}
	hold()
	wg.Wait()
	if want := []int64{-40, 10, 10, 20, 30}; !slices.Equal(order, want) {
		t.Errorf("started %v, want %v (negative: gave up)", order, want)
	}
	if s.free != 1 {
		t.Errorf("%d slots free after all, want 1", s.free)
	}
}

func (s *Starts) waitingLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// A nil Starts bounds nothing.
func TestNilStartsBoundsNothing(t *testing.T) {
	t.Parallel()
	var s *Starts
	for range 3 {
		if _, err := s.take(context.Background(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if NewStarts(0) != nil || NewStarts(-1) != nil {
		t.Error("NewStarts of no bound is not nil")
	}
}
