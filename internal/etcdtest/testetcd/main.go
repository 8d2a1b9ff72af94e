// Command testetcd runs one embedded etcd member until SIGTERM or SIGINT.
// Multi-process tests run it as the cluster's etcd, so that they can kill,
// pause and restart etcd on its data directory like a real server.
//
// `testetcd restore` restores a snapshot (saved with the Maintenance API, as
// etcdctl snapshot save does) into a member's data directory with etcd's own
// restore code, etcdutl's: the disaster-recovery procedure the tests put
// shardd through, --bump-revision and --mark-compacted included.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/shardd/shardd/pkg/embedetcd"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "restore" {
		if err := restore(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "testetcd restore:", err)
			os.Exit(1)
		}
		return
	}
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

// restore restores a snapshot into the data directory a member started by
// this command on --data-dir would use.
func restore(args []string) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	snap := fs.String("snapshot", "", "snapshot file")
	dir := fs.String("data-dir", "", "the member's data directory (restored into its etcd/)")
	peer := fs.String("peer-url", "http://127.0.0.1:2380", "peer URL")
	name := fs.String("name", "shardd", "member name")
	bump := fs.Uint64("bump-revision", 0, "how much to raise the revision by")
	compacted := fs.Bool("mark-compacted", false, "mark the revisions up to the bumped one compacted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        *snap,
		Name:                *name,
		OutputDataDir:       filepath.Join(*dir, "etcd"),
		PeerURLs:            []string{*peer},
		InitialCluster:      *name + "=" + *peer,
		InitialClusterToken: "etcd-cluster",
		RevisionBump:        *bump,
		MarkCompacted:       *compacted,
	})
}
