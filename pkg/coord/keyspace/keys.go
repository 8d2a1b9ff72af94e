package keyspace

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// DefaultPrefix is the default root of shardd's etcd keyspace.
const DefaultPrefix = "/shardd"

// Keys builds every etcd key shardd uses; no other file spells a key.
//
//	<prefix>/instances/<id>                    session   instance info (JSON)
//	<prefix>/jobs/<job>/config                 none      registered job definition (JSON); ModRevision = generation
//	<prefix>/jobs/<job>/loaded/<id>            none      the definition instance <id> last loaded from its files
//	<prefix>/jobs/<job>/versions/<n>           none      the job's last VersionsKept registered definitions, n counting from 1
//	<prefix>/jobs/<job>/members/<id>           session   instance may run the job
//	<prefix>/jobs/<job>/disabled/job           none      the job is disabled
//	<prefix>/jobs/<job>/disabled/instances/<id> none     the instance is disabled for the job
//	<prefix>/jobs/<job>/disabled/items/<n>     none      the item is disabled
//	<prefix>/jobs/<job>/leader/<lease>         session   a candidate's id; the oldest leads (concurrency.Election's layout)
//	<prefix>/jobs/<job>/shards                 none      shard map (JSON), leader only, fenced
//	<prefix>/jobs/<job>/items/<n>              none      last claimed fire of the item (JSON), fenced claims
//	<prefix>/jobs/<job>/running/<n>            session   the instance running the item
//	<prefix>/jobs/<job>/history/<n>/<slot>     none      last HistoryPerItem executions of the item (ring)
//	<prefix>/jobs/<job>/triggers/<id>          1 minute  a one-off run requested by an operator;
//	                                           none      or by a parent's completed fire (upstream trigger, "u…" ids)
//	<prefix>/jobs/<job>/kills/<id>             1 minute  runs in progress an operator asked to stop
//	<prefix>/jobs/<job>/lastfailure            none      the record of the job's latest failed run
//	<prefix>/jobs/<job>/fires/<fire>           none      a fire's barrier: how each item of it ended (dependencies)
//	<prefix>/jobs/<job>/children               none      the jobs that depend on job, each with all its parents (JSON)
//	<prefix>/jobs/<job>/lastsuccess            none      the key of job's latest fire whose every item succeeded
//	<prefix>/jobs/<job>/deps                   none      a child of several parents: the parent fires it consumed (JSON)
//	<prefix>/audit/<id>                        none      the operators' write actions, oldest trimmed (AuditKeep)
//	<prefix>/placement/<job>                   none      the job is applied (shardd apply): its selector (JSON)
type Keys struct {
	prefix string // cleaned, no trailing slash
}

// NewKeys returns the keyspace under prefix ("/shardd" if empty).
func NewKeys(prefix string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{prefix: strings.TrimSuffix(path.Clean("/"+prefix), "/")}
}

// Prefix returns the keyspace root.
func (k Keys) Prefix() string { return k.prefix }

func (k Keys) Instances() string            { return k.prefix + "/instances/" }
func (k Keys) Instance(id string) string    { return k.Instances() + id }
func (k Keys) Jobs() string                 { return k.prefix + "/jobs/" }
func (k Keys) JobPrefix(job string) string  { return k.Jobs() + job + "/" }
func (k Keys) Config(job string) string     { return k.JobPrefix(job) + "config" }
func (k Keys) Loaded(job, id string) string { return k.JobPrefix(job) + "loaded/" + id }
func (k Keys) Members(job string) string    { return k.JobPrefix(job) + "members/" }
func (k Keys) Member(job, id string) string { return k.Members(job) + id }
func (k Keys) Versions(job string) string   { return k.JobPrefix(job) + "versions/" }
func (k Keys) Version(job string, n int64) string {
	return k.Versions(job) + fmt.Sprintf("%012d", n) // sorts by n
}
func (k Keys) Disabled(job string) string { return k.JobPrefix(job) + "disabled/" }
func (k Keys) DisabledJob(job string) string {
	return k.Disabled(job) + "job"
}
func (k Keys) DisabledInstances(job string) string { return k.Disabled(job) + "instances/" }
func (k Keys) DisabledInstance(job, id string) string {
	return k.DisabledInstances(job) + id
}
func (k Keys) DisabledItems(job string) string { return k.Disabled(job) + "items/" }
func (k Keys) DisabledItem(job string, item int) string {
	return k.DisabledItems(job) + strconv.Itoa(item)
}

// Leader is the prefix of job's election candidates' keys.
func (k Keys) Leader(job string) string { return k.Election(job) + "/" }

// Election is the prefix to give concurrency.NewElection for job; it adds
// the "/" itself.
func (k Keys) Election(job string) string { return k.JobPrefix(job) + "leader" }
func (k Keys) Items(job string) string    { return k.JobPrefix(job) + "items/" }
func (k Keys) Item(job string, item int) string {
	return k.Items(job) + strconv.Itoa(item)
}
func (k Keys) Running(job string) string { return k.JobPrefix(job) + "running/" }
func (k Keys) RunningItem(job string, item int) string {
	return k.Running(job) + strconv.Itoa(item)
}
func (k Keys) HistoryPrefix(job string) string { return k.JobPrefix(job) + "history/" }
func (k Keys) Triggers(job string) string      { return k.JobPrefix(job) + "triggers/" }
func (k Keys) Trigger(job, id string) string   { return k.Triggers(job) + id }
func (k Keys) Kills(job string) string         { return k.JobPrefix(job) + "kills/" }
func (k Keys) LastFailure(job string) string   { return k.JobPrefix(job) + "lastfailure" }
func (k Keys) Fires(job string) string         { return k.JobPrefix(job) + "fires/" }
func (k Keys) Fire(job, fire string) string    { return k.Fires(job) + fire }
func (k Keys) Children(job string) string      { return k.JobPrefix(job) + "children" }
func (k Keys) LastSuccess(job string) string   { return k.JobPrefix(job) + "lastsuccess" }
func (k Keys) Deps(job string) string          { return k.JobPrefix(job) + "deps" }
func (k Keys) Pause(job string) string         { return k.JobPrefix(job) + "pause" }
func (k Keys) Slots(job string) string         { return k.JobPrefix(job) + "slots/" }
func (k Keys) Slot(job string, slot int) string {
	return k.Slots(job) + strconv.Itoa(slot)
}
func (k Keys) Waiting(job string) string { return k.JobPrefix(job) + "waiting/" }
func (k Keys) WaitingItem(job string, item int) string {
	return k.Waiting(job) + strconv.Itoa(item)
}
func (k Keys) Kill(job, id string) string { return k.Kills(job) + id }
func (k Keys) Audit() string              { return k.prefix + "/audit/" }
func (k Keys) History(job string, item int, slot int64) string {
	return k.HistoryPrefix(job) + strconv.Itoa(item) + "/" + strconv.FormatInt(slot, 10)
}
func (k Keys) Shards(job string) string { return k.JobPrefix(job) + "shards" }

// JobOf returns the job name in a key under Jobs(), or "".
func (k Keys) JobOf(key string) string {
	rest, ok := strings.CutPrefix(key, k.Jobs())
	if !ok {
		return ""
	}
	job, _, _ := strings.Cut(rest, "/")
	return job
}

// LastSegment returns what follows the last '/' of key.
func LastSegment(key string) string {
	return key[strings.LastIndexByte(key, '/')+1:]
}

// Rewinds holds, per instance, what it saw of etcd's history going back
// (RewindRecord). It sorts right after jobs/, so that the jobs watch covers
// both: [Jobs(), RewindsEnd()).
func (k Keys) Rewinds() string         { return k.prefix + "/rewinds/" }
func (k Keys) Rewind(id string) string { return k.Rewinds() + id }
func (k Keys) RewindsEnd() string      { return k.prefix + "/rewinds0" } // "0" follows "/"

// Placements lists the applied jobs (Placement values), so that an
// instance finds them with one read of a small range, not a scan of every
// job's keys. It sorts between jobs/ and rewinds/: the jobs watch covers it.
func (k Keys) Placements() string          { return k.prefix + "/placement/" }
func (k Keys) Placement(job string) string { return k.Placements() + job }
func (k Keys) PlacementOf(key string) string {
	job, ok := strings.CutPrefix(key, k.Placements())
	if !ok || strings.Contains(job, "/") {
		return ""
	}
	return job
}

// Floor is the key written to raise etcd's revision after it went back
// (rewind.go); outside the jobs watch's range.
func (k Keys) Floor() string { return k.prefix + "/floor" }
