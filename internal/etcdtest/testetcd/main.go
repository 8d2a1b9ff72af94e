// Command testetcd runs one embedded etcd member until SIGTERM or SIGINT.
// Multi-process tests run it as the cluster's etcd, so that they can kill,
// pause and restart etcd on its data directory like a real server.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardd/shardd/pkg/embedetcd"
)

func main() {
	dir := flag.String("data-dir", "", "data directory")
	client := flag.String("client-url", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("peer-url", "http://127.0.0.1:2380", "peer URL")
	name := flag.String("name", "shardd", "member name")
	cluster := flag.String("initial-cluster", "", "name=peerURL,... of a new multi-member cluster")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := embedetcd.Start(ctx, embedetcd.Options{Dir: *dir, ClientURL: *client, PeerURL: *peer, Name: *name, InitialCluster: *cluster, LogLevel: "error"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testetcd:", err)
		os.Exit(1)
	}
	fmt.Println("ready", srv.ClientURL())
	select {
	case <-ctx.Done():
	case err := <-srv.Err():
		fmt.Fprintln(os.Stderr, "testetcd:", err)
	}
	srv.Close()
}
