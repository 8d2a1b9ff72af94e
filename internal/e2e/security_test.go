package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/embedetcd"
)

// The security tests: the embedded etcd and the API refuse other local
// users; shardd runs on an etcd with client-certificate TLS, auth and a
// role limited to its prefix; the API serves TLS.

// attackEnv carries the targets to the attacker, this test binary run
// again as another user (see TestMain).
const attackEnv = "SHARDD_E2E_ATTACK"

type attackTargets struct {
	ClientURL, PeerURL, API string
	DataDir, TokenFile      string
	Job                     string
	Scratch                 string // a directory the attacker may write
}

// runAttacks tries, as whoever runs it, every way in that the owner-only
// default must close, and prints what happened to each as JSON:
// "SUCCEEDED" or why it failed.
func runAttacks(spec string) {
	var t attackTargets
	if err := json.Unmarshal([]byte(spec), &t); err != nil {
		fmt.Println(`{"setup":"bad spec"}`)
		os.Exit(2)
	}
	out := map[string]string{}
	try := func(name string, f func() error) {
		if err := f(); err != nil {
			out[name] = "refused: " + err.Error()
		} else {
			out[name] = "SUCCEEDED"
		}
	}
	evil := `{"name":"` + t.Job + `","cron":"* * * * * ?","shardingTotalCount":1,"script":["/usr/bin/id"]}`
	put := func(endpoint string, cfg *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, TLS: cfg, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err = cli.Put(ctx, "/shardd/jobs/"+t.Job+"/config", evil)
		return err
	}
	try("etcd: TLS without a client certificate", func() error {
		return put(t.ClientURL, &tls.Config{InsecureSkipVerify: true})
	})
	try("etcd: TLS with a client certificate of another CA", func() error {
		own, err := embedetcd.EnsureTLS(filepath.Join(t.Scratch, "own"), []string{"127.0.0.1"}, time.Now())
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		pair, err := tls.LoadX509KeyPair(own.ClientCert, own.ClientKey)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		return put(t.ClientURL, &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}})
	})
	try("etcd: plain HTTP", func() error {
		return put(strings.Replace(t.ClientURL, "https://", "http://", 1), nil)
	})
	get := func(url, token string, method string) error {
		req, _ := http.NewRequest(method, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return errors.New(resp.Status)
		}
		return nil
	}
	try("etcd peer port: TLS without a client certificate", func() error { return get(t.PeerURL+"/members", "", "GET") })
	try("etcd peer port: plain HTTP", func() error {
		return get(strings.Replace(t.PeerURL, "https://", "http://", 1)+"/members", "", "GET")
	})
	try("etcd client port: HTTP gateway without a client certificate", func() error {
		return get(t.ClientURL+"/v3/kv/range", "", "POST")
	})
	for name, path := range map[string]string{
		"read the client key":     embedetcd.Files(t.DataDir).ClientKey,
		"read the CA key":         embedetcd.Files(t.DataDir).CAKey,
		"read etcd's database":    filepath.Join(t.DataDir, "etcd", "member", "snap", "db"),
		"read the API token file": t.TokenFile,
	} {
		try(name, func() error { _, err := os.ReadFile(path); return err })
	}
	try("API: trigger without a token", func() error { return get(t.API+"/api/v1/jobs/"+t.Job+"/trigger", "", "POST") })
	try("API: trigger with a guessed token", func() error {
		return get(t.API+"/api/v1/jobs/"+t.Job+"/trigger", "0123456789abcdef", "POST")
	})
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

// nobody returns the ids of the user nobody.
func nobody(t *testing.T) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skip("no user nobody:", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// asNobody runs cmd as the user nobody.
func asNobody(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	uid, gid := nobody(t)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
}

// publicDir returns a new directory every user can enter and read, with a
// copy of each of files (executables) in it.
func publicDir(t *testing.T, files ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shardd-sec")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// daemon is a shardd run process started by the security tests.
type daemon struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
}

func (d *daemon) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.Write(p)
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

func startDaemon(t *testing.T, env []string, prepare func(*exec.Cmd), args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(bin.shardd, args...), done: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), env...)
	d.cmd.Stderr = d
	if prepare != nil {
		prepare(d.cmd)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(20 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("log of shardd %v:\n%s", args, d.log())
		}
	})
	return d
}

// TestEmbeddedEtcdAcceptsOnlyItsOwner: with the README's default (the
// embedded etcd), another local user can neither read nor write the
// cluster, through etcd, its peer port, its files or the API, while the
// owner's CLI works without flags beyond the data directory.
func TestEmbeddedEtcdAcceptsOnlyItsOwner(t *testing.T) {
	parallel(t)
	if os.Getuid() != 0 {
		t.Skip("needs root, to run the attacker as another user")
	}
	pub := publicDir(t, bin.shardd, os.Args[0])
	shardd, attacker := filepath.Join(pub, "shardd"), filepath.Join(pub, filepath.Base(os.Args[0]))
	work := t.TempDir() // 0700, root's
	dataDir := filepath.Join(work, "data")
	tokenFile := filepath.Join(work, "token")
	if err := os.WriteFile(tokenFile, []byte("owner-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(work, "ran")
	cfg := filepath.Join(work, "jobs.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("jobs:\n  - name: report\n    cron: \"0 0 3 * * ?\"\n    shardingTotalCount: 2\n    script: [/bin/sh, -c, 'echo $SHARDD_ITEM >> %s']\n", marker)), 0o644)
	client, peer, api := "https://"+etcdtest.FreeAddr(t), "https://"+etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	d := startDaemon(t, nil, nil, "run", "--config", cfg, "--data-dir", dataDir, "--name", "owner",
		"--embed-client-url", client, "--embed-peer-url", peer, "--listen", api, "--api-token-file", tokenFile, "--log-format", "json")

	owner := func(args ...string) (string, error) {
		out, err := exec.Command(shardd, append(args, "--etcd", client, "--data-dir", dataDir)...).CombinedOutput()
		return string(out), err
	}
	etcdtest.Eventually(t, 30*time.Second, "the owner's shardd status to show the job", func() bool {
		out, err := owner("status")
		return err == nil && strings.Contains(out, "report")
	})
	if strings.Contains(d.log(), "accepts anonymous") {
		t.Errorf("the embedded etcd was found open to anonymous clients:\n%s", d.log())
	}

	// Another user, with the same binary, the same flags.
	cmd := exec.Command(shardd, "status", "--etcd", client, "--data-dir", dataDir, "--timeout", "3s")
	asNobody(t, cmd)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "accepts only its owner") {
		t.Errorf("shardd status as nobody: err %v, output %s; want a refusal naming the owner", err, out)
	}

	// The attack of the issue: a second shardd run registering its own
	// definition of the job (overwrite: true), with the owner's data dir
	// and with a data dir of its own.
	scratch := filepath.Join(pub, "scratch")
	os.Mkdir(scratch, 0o777)
	os.Chmod(scratch, 0o777)
	evil := filepath.Join(pub, "evil.yaml")
	os.WriteFile(evil, []byte("jobs:\n  - name: report\n    overwrite: true\n    cron: \"* * * * * ?\"\n    shardingTotalCount: 2\n    script: [/usr/bin/id]\n"), 0o644)
	for _, dir := range []string{dataDir, filepath.Join(scratch, "evil-data")} {
		// --run-log-dir none: a run log directory in scratch (which others
		// can write) would be refused before etcd is asked.
		cmd := exec.Command(shardd, "run", "--config", evil, "--etcd", client, "--data-dir", dir, "--name", "evil", "--listen", "", "--etcd-dial-timeout", "2s", "--run-log-dir", "none")
		asNobody(t, cmd)
		cmd.Dir = scratch
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			t.Logf("evil shardd run --data-dir %s exited (%v): %s", dir, err, lastLine(buf.String()))
		case <-time.After(8 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Logf("evil shardd run --data-dir %s still trying after 8s, killed: %s", dir, lastLine(buf.String()))
		}
	}

	// A data dir another user prepared where the owner will start shardd
	// (a world-writable directory): its CA would make every certificate
	// the attacker's. The owner's shardd run and CLI refuse it.
	planted := filepath.Join(scratch, "planted")
	own, err := embedetcd.EnsureTLS(filepath.Join(planted, "shardd-data"), []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(own.Endpoint, []byte(client+"\n"), 0o644)
	uid, gid := nobody(t)
	filepath.Walk(planted, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, uid, gid) })
	run := exec.Command(shardd, "run", "--config", cfg, "--name", "owner2", "--listen", "",
		"--embed-client-url", "https://"+etcdtest.FreeAddr(t), "--embed-peer-url", "https://"+etcdtest.FreeAddr(t))
	run.Dir = planted
	if out, err := run.CombinedOutput(); err == nil || !strings.Contains(string(out), "belongs to uid") {
		t.Errorf("shardd run in a data dir another user prepared: %v\n%s", err, out)
	}
	status := exec.Command(shardd, "status", "--timeout", "3s")
	status.Dir = planted
	if out, err := status.CombinedOutput(); err == nil || !strings.Contains(string(out), "not trusted") {
		t.Errorf("shardd status with a data dir another user prepared: %v\n%s", err, out)
	}

	// Every other way in.
	spec, _ := json.Marshal(attackTargets{ClientURL: client, PeerURL: peer, API: "http://" + api, DataDir: dataDir, TokenFile: tokenFile, Job: "report", Scratch: scratch})
	cmd = exec.Command(attacker, "-test.run", "^$")
	cmd.Env = append(os.Environ(), attackEnv+"="+string(spec))
	asNobody(t, cmd)
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("attacker: %v: %s", err, raw)
	}
	var results map[string]string
	if err := json.Unmarshal(bytes.TrimSpace(raw), &results); err != nil || len(results) < 10 {
		t.Fatalf("attacker output %q: %v", raw, err)
	}
	for name, res := range results {
		t.Logf("as nobody, %s: %s", name, res)
		if res == "SUCCEEDED" {
			t.Errorf("as nobody, %s SUCCEEDED", name)
		}
	}

	// Nothing changed: the definition is the owner's, no instance "evil"
	// joined, and the owner's CLI still changes the cluster.
	if out, err := owner("status", "-o", "json"); err != nil || strings.Contains(out, "/usr/bin/id") || strings.Contains(out, "evil") || !strings.Contains(out, "echo $SHARDD_ITEM") {
		t.Errorf("after the attacks, the job's status: err %v\n%s", err, out)
	}
	if out, err := owner("trigger", "report"); err != nil {
		t.Errorf("owner's trigger: %v %s", err, out)
	}
	etcdtest.Eventually(t, 20*time.Second, "the owner's trigger to run both items", func() bool {
		b, _ := os.ReadFile(marker)
		return strings.Count(string(b), "\n") >= 2
	})
	// The owner's token still works over the API.
	req, _ := http.NewRequest("POST", "http://"+api+"/api/v1/jobs/report/trigger", nil)
	req.Header.Set("Authorization", "Bearer owner-token-0123456789")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Errorf("owner's API trigger: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	for _, f := range []string{"ca.key", "client.key", "server.key"} {
		fi, err := os.Stat(filepath.Join(dataDir, "tls", f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Join(dataDir, "tls")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("tls dir: %v %v; want 0700", err, fi.Mode())
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// TestEtcdWithClientCertsAuthAndAPrefixRole: shardd on a real etcd that
// requires client certificates, has auth enabled, and gives shardd's users
// a role limited to the /shardd/ prefix: by certificate (the user is the
// certificate's common name) and by password. The cluster runs every item;
// scripts do not inherit the etcd password; no exposure warning.
func TestEtcdWithClientCertsAuthAndAPrefixRole(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	client, peer := "https://"+etcdtest.FreeAddr(t), "https://"+etcdtest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Options{Dir: dir, ClientURL: client, PeerURL: peer, TLS: true, LogLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	files := embedetcd.Files(dir) // client.crt's common name is "shardd"
	tlsCfg := func(cert bool) *tls.Config {
		cfg, err := clientTLS(files.CA, files.ClientCert, files.ClientKey, cert)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, TLS: tlsCfg(true), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const pw = "etcd-password-of-shardd-pw"
	steps := []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "shardd"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "shardd", "/shardd/", clientv3.GetPrefixRangeEnd("/shardd/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error {
			_, err := admin.UserAddWithOptions(ctx, "shardd", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := admin.UserGrantRole(ctx, "shardd", "shardd"); return err },
		func() error { _, err := admin.UserAdd(ctx, "shardd-pw", pw); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "shardd-pw", "shardd"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("etcd auth setup step %d: %v", i, err)
		}
	}
	// The role is really limited: the certificate's user cannot write
	// beyond the prefix, and a client without a certificate gets nowhere.
	user, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, TLS: tlsCfg(true), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if _, err := user.Put(ctx, "/elsewhere", "x"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("put beyond the prefix as shardd: %v, want permission denied", err)
	}
	if _, err := user.Put(ctx, "/shardd/probe", "x"); err != nil {
		t.Fatalf("put under the prefix as shardd: %v", err)
	}

	// Instance c runs as an unprivileged user, as in production: its
	// scripts, of the same user, must not find its password anywhere in
	// /proc, which root's would.
	var asUser func(*exec.Cmd)
	work, cfgDir := t.TempDir(), t.TempDir()
	if os.Getuid() == 0 {
		work, cfgDir = publicDir(t), publicDir(t) // the job file: others may read it, not write it
		os.Chmod(work, 0o777)
		asUser = func(cmd *exec.Cmd) { asNobody(t, cmd) }
	}
	os.WriteFile(filepath.Join(work, "ran"), nil, 0o666) // every instance appends
	os.Chmod(filepath.Join(work, "ran"), 0o666)
	cfg := filepath.Join(cfgDir, "jobs.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`jobs:
  - name: nightly
    cron: "0 0 3 * * ?"
    shardingTotalCount: 3
    script: [/bin/sh, -c, 'env > %[1]s/env-$SHARDD_INSTANCE; cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n" | grep -c "^SHARDD_ETCD_PASSWORD=" > %[1]s/proc-$SHARDD_INSTANCE; echo $SHARDD_ITEM >> %[1]s/ran']
`, work)), 0o644)
	conn := []string{"--etcd", client, "--etcd-ca", files.CA, "--etcd-cert", files.ClientCert, "--etcd-key", files.ClientKey}
	// This etcd runs in the test process, where a password check (bcrypt,
	// each connect of c's client) costs a second of CPU under -race: a
	// 2 s TTL fenced all three on that stall. The test judges access, not
	// failover speed.
	const sessionTTL = "6s"
	var ds []*daemon
	for _, name := range []string{"a", "b", "c"} {
		args := append([]string{"run", "--config", cfg, "--name", name, "--ttl", sessionTTL, "--listen", "", "--log-format", "json", "--run-log-dir", t.TempDir()}, conn...)
		var env []string
		var prepare func(*exec.Cmd)
		if name == "c" {
			// its own copy of the binary and the certificate, readable by it
			own := publicDir(t, bin.shardd)
			os.Mkdir(filepath.Join(own, "runs"), 0o700) // its run logs
			if asUser != nil {
				uid, gid := nobody(t)
				os.Chown(filepath.Join(own, "runs"), uid, gid)
			}
			for _, f := range []string{files.CA, files.ClientCert, files.ClientKey} {
				b, _ := os.ReadFile(f)
				os.WriteFile(filepath.Join(own, filepath.Base(f)), b, 0o600)
				if asUser != nil {
					uid, gid := nobody(t)
					os.Chown(filepath.Join(own, filepath.Base(f)), uid, gid)
				}
			}
			args = []string{"run", "--config", cfg, "--name", name, "--ttl", sessionTTL, "--listen", "", "--log-format", "json",
				"--etcd", client, "--etcd-ca", filepath.Join(own, "ca.crt"), "--etcd-cert", filepath.Join(own, "client.crt"), "--etcd-key", filepath.Join(own, "client.key"),
				"--etcd-user", "shardd-pw", "--run-log-dir", filepath.Join(own, "runs")}
			env = []string{"SHARDD_ETCD_PASSWORD=" + pw}
			prepare = func(cmd *exec.Cmd) {
				cmd.Path, cmd.Args[0] = filepath.Join(own, "shardd"), filepath.Join(own, "shardd")
				cmd.Dir = own
				if asUser != nil {
					asUser(cmd)
				}
			}
		}
		ds = append(ds, startDaemon(t, env, prepare, args...))
	}
	ops := func(args ...string) (string, error) {
		out, err := exec.Command(bin.shardd, append(args, conn...)...).CombinedOutput()
		return string(out), err
	}
	etcdtest.Eventually(t, 30*time.Second, "an item on each instance", func() bool {
		out, err := ops("status", "-o", "json")
		return err == nil && owners(out, "nightly") == 3
	})
	if out, err := ops("trigger", "nightly"); err != nil {
		t.Fatalf("trigger: %v %s", err, out)
	}
	etcdtest.Eventually(t, 30*time.Second, "every item to run, one on each instance", func() bool {
		b, _ := os.ReadFile(filepath.Join(work, "ran"))
		for _, n := range []string{"a", "b", "c"} {
			if _, err := os.Stat(filepath.Join(work, "env-"+n)); err != nil {
				return false
			}
		}
		return strings.Count(string(b), "\n") >= 3
	})
	env, _ := os.ReadFile(filepath.Join(work, "env-c"))
	if strings.Contains(string(env), "SHARDD_ETCD_PASSWORD") || strings.Contains(string(env), pw) {
		t.Errorf("a script of the instance with an etcd password sees it:\n%s", env)
	}
	if asUser != nil {
		if b, _ := os.ReadFile(filepath.Join(work, "proc-c")); strings.TrimSpace(string(b)) != "0" {
			t.Errorf("a script of the instance with an etcd password finds it in /proc (count %q)", b)
		}
	}
	for i, d := range ds {
		if strings.Contains(d.log(), "accepts anonymous") || strings.Contains(d.log(), `"level":"ERROR"`) {
			t.Errorf("instance %d logged an error or an exposure:\n%s", i, d.log())
		}
	}
	etcdtest.Eventually(t, 20*time.Second, "every instance to find etcd closed to anonymous clients", func() bool {
		for _, d := range ds {
			if !strings.Contains(d.log(), "etcd refuses anonymous clients") {
				return false
			}
		}
		return true
	})
}

// owners returns how many distinct instances own items of job in the
// output of shardd status -o json.
func owners(statusJSON, job string) int {
	var st admin.ClusterStatus
	if json.Unmarshal([]byte(statusJSON), &st) != nil {
		return 0
	}
	seen := map[string]bool{}
	for _, j := range st.Jobs {
		for _, it := range j.Items {
			if j.Name == job && it.Instance != "" {
				seen[it.Instance] = true
			}
		}
	}
	return len(seen)
}

// clientTLS is a client TLS configuration trusting ca, presenting the
// certificate cert/key when withCert.
func clientTLS(ca, cert, key string, withCert bool) (*tls.Config, error) {
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{RootCAs: x509.NewCertPool()}
	cfg.RootCAs.AppendCertsFromPEM(pem)
	if withCert {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// TestEtcdOpenToAnonymousIsReported: on an etcd with neither client
// certificates nor auth (the harness's), shardd says so, loudly, and
// exports it.
func TestEtcdOpenToAnonymousIsReported(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	api := etcdtest.FreeAddr(t)
	p := startShardd(t, e, "a", writeConfig(t, "j:1"), "--listen", api)
	etcdtest.Eventually(t, 20*time.Second, "the exposure metric", func() bool {
		b, err := httpGetQuiet("http://" + api + "/metrics")
		return err == nil && strings.Contains(string(b), `shardd_etcd_exposed{exposure="anonymous"} 1`)
	})
	if len(p.find(func(rec map[string]any) bool {
		m, _ := rec["msg"].(string)
		return rec["level"] == "ERROR" && strings.HasPrefix(m, "SECURITY: etcd accepts anonymous clients")
	})) == 0 {
		t.Errorf("no SECURITY error in the log:\n%s", p.rawLog())
	}

	// An etcd that comes up after shardd is probed once it answers.
	late := newEtcd(t)
	api2 := etcdtest.FreeAddr(t)
	p2 := startShardd(t, late, "b", writeConfig(t, "j:1"), "--listen", api2)
	etcdtest.Eventually(t, 20*time.Second, "shardd to find no etcd", func() bool { return len(p2.find(msg("cannot reach etcd; retrying"))) > 0 })
	if b, err := httpGetQuiet("http://" + api2 + "/metrics"); err == nil && strings.Contains(string(b), `exposure="anonymous"`) {
		t.Errorf("exposure reported before etcd was reachable:\n%s", b)
	}
	late.start()
	etcdtest.Eventually(t, 90*time.Second, "the exposure metric of a late etcd", func() bool {
		b, err := httpGetQuiet("http://" + api2 + "/metrics")
		return err == nil && strings.Contains(string(b), `shardd_etcd_exposed{exposure="anonymous"} 1`)
	})
}

// TestAPIOverTLS: the token works over TLS, plain HTTP is refused on the
// TLS port, and with a client CA a client without a certificate is refused.
func TestAPIOverTLS(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	pki := t.TempDir()
	files, err := embedetcd.EnsureTLS(pki, []string{"127.0.0.1"}, time.Now()) // a CA, a server and a client certificate
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("api-token-over-tls-0123\n"), 0o600)
	api, mtlsAPI := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	cfg := writeConfig(t, "j:1")
	startShardd(t, e, "a", cfg, "--listen", api, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--api-token-file", token)
	startShardd(t, e, "b", cfg, "--listen", mtlsAPI, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-client-ca", files.CA, "--api-token-file", token)

	withCert, err := clientTLS(files.CA, files.ClientCert, files.ClientKey, true)
	if err != nil {
		t.Fatal(err)
	}
	withoutCert, _ := clientTLS(files.CA, "", "", false)
	call := func(tlsCfg *tls.Config, url, tok string) (int, string, error) {
		req, _ := http.NewRequest("POST", url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	etcdtest.Eventually(t, 20*time.Second, "the TLS API", func() bool {
		code, _, err := call(withoutCert, "https://"+api+"/api/v1/jobs/j/trigger", "api-token-over-tls-0123")
		return err == nil && code == http.StatusAccepted
	})
	if code, body, err := call(withoutCert, "https://"+api+"/api/v1/jobs/j/trigger", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("over TLS without the token: %d %s %v, want 401", code, body, err)
	}
	if code, body, err := call(nil, "http://"+api+"/api/v1/jobs/j/trigger", "api-token-over-tls-0123"); err == nil && code/100 == 2 {
		t.Errorf("plain HTTP on the TLS port: %d %s, want refused", code, body)
	} else {
		t.Logf("plain HTTP on the TLS port: %d %q %v", code, strings.TrimSpace(body), err)
	}
	etcdtest.Eventually(t, 20*time.Second, "the client-certificate API", func() bool {
		code, _, err := call(withCert, "https://"+mtlsAPI+"/api/v1/jobs/j/trigger", "api-token-over-tls-0123")
		return err == nil && code == http.StatusAccepted
	})
	if code, _, err := call(withoutCert, "https://"+mtlsAPI+"/api/v1/jobs/j/trigger", "api-token-over-tls-0123"); err == nil {
		t.Errorf("without a client certificate on a --tls-client-ca listener: %d, want a failed handshake", code)
	}
	// Limits: a header block over the cap is refused without reaching the API.
	req, _ := http.NewRequest("GET", "https://"+api+"/api/v1/jobs", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 200<<10))
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: withoutCert}}
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("200 KiB of headers: %s, want 431", resp.Status)
		}
	}
}
