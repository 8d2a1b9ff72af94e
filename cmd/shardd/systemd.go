package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"time"
)

// sdNotify sends a state to systemd when run under Type=notify
// (NOTIFY_SOCKET set); it does nothing otherwise.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// sdWatchdogInterval returns how often to ping systemd's watchdog (half its
// WatchdogSec), or 0 when it is not enabled for this process.
func sdWatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}

// runSystemd tells systemd READY=1 once up() first holds, then pings its
// watchdog while ctx lasts.
func runSystemd(ctx context.Context, up func() bool) {
	ready := false
	interval := sdWatchdogInterval()
	tick := 200 * time.Millisecond
	if interval > 0 && interval < tick {
		tick = interval
	}
	lastPing := time.Time{}
	for {
		if !ready && up() {
			sdNotify("READY=1\nSTATUS=etcd session up")
			ready = true
		}
		if interval > 0 && time.Since(lastPing) >= interval {
			sdNotify("WATCHDOG=1")
			lastPing = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(tick):
		}
	}
}
