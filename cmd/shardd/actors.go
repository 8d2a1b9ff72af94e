package main

import (
	"context"
	"errors"
	"net/http"

	oklogrun "github.com/oklog/run"
)

// actors own shardd run's long-lived goroutines, one actor each (an
// oklog/run group, as in Prometheus's main). run starts them all; once the
// first returns, it stops each in the order it was added, one after the
// other (a stop may block: the daemon's waits for running items), then
// waits for every one to return.
type actors struct {
	ctx context.Context // the parent of the loops' contexts
	g   oklogrun.Group
}

// add adds an actor: run runs until stop makes it return.
func (a *actors) add(run func() error, stop func()) {
	a.g.Add(run, func(error) { stop() })
}

// loop adds f, which runs until its context, a child of a.ctx, is
// cancelled: its stop.
func (a *actors) loop(f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(a.ctx)
	a.add(func() error { f(ctx); return nil }, cancel)
}

// wait adds f, which returns when stop is closed, or earlier with the
// reason to stop every actor.
func (a *actors) wait(f func(stop <-chan struct{}) error) {
	stop := make(chan struct{})
	a.add(func() error { return f(stop) }, func() { close(stop) })
}

// serve adds an HTTP server: serve serves until stop closes or shuts down
// the server, and the http.ErrServerClosed it then returns is no error.
func (a *actors) serve(serve func() error, stop func()) {
	a.add(func() error {
		if err := serve(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, stop)
}

// run runs the actors until the first returns, stops them all, and
// returns the first one's error.
func (a *actors) run() error { return a.g.Run() }
