package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/url"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/elasticjob"
	"github.com/shardd/shardd/pkg/selector"
)

// shardd import: ElasticJob job configurations to shardd definitions
// (package elasticjob), from a file or from a live registry (ZooKeeper, or
// etcd), to stdout or applied. The module github.com/go-zookeeper/zk is
// the ZooKeeper client (the maintained fork of samuel/go-zookeeper, no
// dependencies of its own): ElasticJob's registry is ZooKeeper.

func cmdImport(e *env, args []string) error {
	fs := newFlagSet(e, "import")
	var o opsFlags
	o.register(fs)
	registry := fs.String("registry", "", "read the job configs from a live ElasticJob registry: `URL` zk://HOST:PORT[,HOST:PORT] (ZooKeeper) or etcd://HOST:PORT (http) / etcds://HOST:PORT (https), with --namespace")
	namespace := fs.String("namespace", "", "the registry's `namespace` (ElasticJob's regCenter.namespace): its jobs are /NAMESPACE/JOB/config")
	only := fs.String("job", "", "convert only this `job`")
	apply := fs.Bool("apply", false, "apply the converted jobs to the cluster (as shardd apply -f would) instead of printing them")
	takeOver := fs.Bool("take-over", false, "with --apply: take over jobs the hosts' files define")
	dry := fs.Bool("dry-run", false, "with --apply: show what applying would change, write nothing")
	var o2 elasticjob.Options
	fs.StringVar(&o2.TimeZone, "time-zone", "", "the time `zone` of the jobs that name none (ElasticJob read their cron in the JVM's zone; shardd reads it in UTC unless told): an IANA name, or GMT+08:00")
	fs.StringVar(&o2.Selector, "selector", "", "the instances.selector of every job without an ElasticJob label (whose label L becomes the selector label=L): `SELECTOR` like role=batch")
	if err := applyEnv(e, fs, etcdFlagNames...); err != nil {
		return err
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if o2.TimeZone != "" {
		if _, err := elasticjob.Zone(o2.TimeZone); err != nil {
			return usageError("--time-zone: %v", err)
		}
	}
	if o2.Selector != "" {
		if _, err := selector.Parse(o2.Selector); err != nil {
			return usageError("--selector: %v", err)
		}
	}
	var res *elasticjob.Result
	var source string
	switch {
	case len(pos) == 1 && *registry == "":
		source = pos[0]
		data, err := os.ReadFile(pos[0])
		if err != nil {
			return &exitError{exitFailure, err}
		}
		if res, err = elasticjob.Parse(pos[0], data, o2); err != nil {
			return &exitError{exitFailure, err}
		}
	case len(pos) == 0 && *registry != "":
		if *namespace == "" {
			return usageError("--registry needs --namespace (ElasticJob's regCenter.namespace)")
		}
		source = *registry + " namespace " + *namespace
		if res, err = readRegistry(*registry, *namespace, *only, o2); err != nil {
			return &exitError{exitFailure, err}
		}
	default:
		return usageError("give one FILE (a Spring Boot application YAML, or a registry job config), or --registry URL --namespace NS")
	}
	if *only != "" {
		res.Jobs = slices.DeleteFunc(res.Jobs, func(j *config.Job) bool { return j.Name != *only })
		res.Notes = slices.DeleteFunc(res.Notes, func(n elasticjob.Note) bool { return n.Job != *only })
		if len(res.Jobs) == 0 && len(res.Notes) == 0 {
			return &exitError{exitFailure, fmt.Errorf("%s has no job %s", source, *only)}
		}
	}
	for _, n := range res.Notes {
		fmt.Fprintf(e.stderr, "shardd import: %s\n", n)
	}
	converted := len(res.Jobs)
	if (*dry || *takeOver) && !*apply {
		return usageError("--dry-run and --take-over are for --apply")
	}
	if *apply && converted > 0 {
		adm, ctx, done, err := o.connect()
		if err != nil {
			return err
		}
		defer done()
		out, err := adm.Apply(ctx, res.Jobs, admin.ApplyOptions{By: cliActor(), TakeOver: *takeOver, DryRun: *dry, Change: "import"})
		if err != nil && !errors.Is(err, admin.ErrRefused) {
			return o.opError(err)
		}
		writeApplied(e.stdout, out, *dry)
		if err != nil {
			return &exitError{exitFailure, err}
		}
	} else if converted > 0 {
		fmt.Fprintf(e.stdout, "# converted from ElasticJob (%s) by shardd import: %d job(s)", source, converted)
		if len(res.Notes) > 0 {
			fmt.Fprintf(e.stdout, "; %d key(s) or job(s) not converted (listed on stderr)", len(res.Notes))
		}
		fmt.Fprintln(e.stdout)
		e.stdout.Write(config.YAML(res.Jobs...))
	}
	switch {
	case converted == 0:
		return &exitError{exitFailure, fmt.Errorf("no job converted from %s", source)}
	case !res.Complete():
		return &exitError{exitFailure, fmt.Errorf("%d job(s) converted; %d note(s) of what was not, above", converted, len(res.Notes))}
	}
	return nil
}

// registryTimeout bounds the reads of a live registry.
const registryTimeout = 10 * time.Second

// readRegistry reads and converts the job configs under /namespace of the
// registry at raw (zk://, etcd://, etcds://); only, when set, is the one
// job to read.
func readRegistry(raw, namespace, only string, o elasticjob.Options) (*elasticjob.Result, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--registry %q: want zk://HOST:PORT, etcd://HOST:PORT or etcds://HOST:PORT", raw)
	}
	root := path.Join("/", namespace)
	var configs map[string][]byte
	switch u.Scheme {
	case "zk", "zookeeper":
		configs, err = zkConfigs(strings.Split(u.Host, ","), root, only)
	case "etcd", "etcds":
		configs, err = etcdConfigs(u, root, only)
	default:
		return nil, fmt.Errorf("--registry %q: scheme %q is not zk, etcd or etcds", raw, u.Scheme)
	}
	if err != nil {
		return nil, err
	}
	if len(configs) == 0 {
		return nil, fmt.Errorf("%s has no job configs under %s (is --namespace ElasticJob's regCenter.namespace?)", raw, root)
	}
	all := &elasticjob.Result{}
	for _, job := range slices.Sorted(maps.Keys(configs)) {
		r, err := elasticjob.ParseRegistry(job, configs[job], o)
		if err != nil {
			all.Notes = append(all.Notes, elasticjob.Note{Job: job, Fatal: true, Reason: err.Error()})
			continue
		}
		all.Jobs = append(all.Jobs, r.Jobs...)
		all.Notes = append(all.Notes, r.Notes...)
	}
	return all, nil
}

// zkConfigs reads /root/<job>/config of every job (or only) from ZooKeeper.
func zkConfigs(servers []string, root, only string) (map[string][]byte, error) {
	conn, events, err := zk.Connect(servers, registryTimeout, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, fmt.Errorf("ZooKeeper %s: %w", strings.Join(servers, ","), err)
	}
	defer conn.Close()
	deadline := time.After(registryTimeout)
	for connected := false; !connected; {
		select {
		case ev := <-events:
			connected = ev.State == zk.StateHasSession
		case <-deadline:
			return nil, fmt.Errorf("ZooKeeper %s: no session within %s (is it running there?)", strings.Join(servers, ","), registryTimeout)
		}
	}
	jobs := []string{only}
	if only == "" {
		jobs, _, err = conn.Children(root)
		if errors.Is(err, zk.ErrNoNode) {
			there, _, _ := conn.Children("/")
			there = slices.DeleteFunc(there, func(n string) bool { return n == "zookeeper" })
			return nil, fmt.Errorf("ZooKeeper %s has no namespace %s (it has: %s)", strings.Join(servers, ","), strings.TrimPrefix(root, "/"), strings.Join(there, ", "))
		}
		if err != nil {
			return nil, fmt.Errorf("ZooKeeper: list %s: %w", root, err)
		}
	}
	out := map[string][]byte{}
	for _, job := range jobs {
		data, _, err := conn.Get(root + "/" + job + "/config")
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue // not a job (ElasticJob keeps other nodes there too)
		case err != nil:
			return nil, fmt.Errorf("ZooKeeper: read %s/%s/config: %w", root, job, err)
		}
		out[job] = data
	}
	return out, nil
}

// etcdConfigs reads the job configs of ElasticJob's etcd registry, whose
// keys are the ZooKeeper paths: /root/<job>/config.
func etcdConfigs(u *url.URL, root, only string) (map[string][]byte, error) {
	scheme := "http"
	if u.Scheme == "etcds" {
		scheme = "https"
	}
	var eps []string
	for _, h := range strings.Split(u.Host, ",") {
		eps = append(eps, scheme+"://"+h)
	}
	cli, err := coord.NewClient(coord.ClientOptions{Endpoints: eps, DialTimeout: registryTimeout})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(eps, ","), err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), registryTimeout)
	defer cancel()
	prefix := root + "/"
	if only != "" {
		prefix += only + "/"
	}
	tree, err := admin.ReadTree(ctx, cli, prefix)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(eps, ","), err)
	}
	out := map[string][]byte{}
	for key, val := range tree {
		rest := strings.TrimPrefix(key, root+"/")
		job, tail, ok := strings.Cut(rest, "/")
		if ok && tail == "config" {
			out[job] = val
		}
	}
	return out, nil
}
