// Package keyspace is shardd's etcd keyspace: the keys (Keys, one method a
// key; no other package builds a key name) and the values stored under
// them, with their states and how they decode. It holds no etcd client and
// does no I/O: the runtime (package coord) and the operator client
// (package admin) read and write these values; the API, the console and
// the CLI show them.
//
// The values, by key (docs/design.md describes the keyspace as a whole):
//
//   - instances/<id>: InstanceInfo, under the instance's lease.
//   - jobs/<job>/config: RegisteredConfig, the one definition the cluster
//     runs; jobs/<job>/loaded/<id>: LoadedRecord.
//   - jobs/<job>/shards: ShardMap, written by the job's leader.
//   - jobs/<job>/items/<n> and history/: ItemRecord, with its states
//     (State*), reasons (Reason*, Skip*) and sources (Source*).
//   - jobs/<job>/triggers/<id>: Trigger; jobs/<job>/kills/<id>: Kill.
//   - jobs/<job>/fires/<fire>: Barrier, the fan-in of a fire's items for
//     the job's children; jobs/<job>/children: ParentsOf, its children;
//     a child's trigger names the parent fire it serves (Upstream).
//   - audit/<id>: AuditEntry; rewinds/<id>: RewindRecord.
package keyspace
