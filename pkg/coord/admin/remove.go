package admin

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Remove deletes every key of a job that no instance defines any more
// (its definition, map, records, history, disable marks). It refuses while
// any live instance is a member of the job or runs one of its items: such
// an instance would register the job again at once. It returns the number
// of keys deleted.
func (c *Client) Remove(ctx context.Context, job string) (int64, error) {
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return 0, err
	}
	if len(f.members) > 0 {
		return 0, opErr(ErrRefused, "job %q is still defined by live instances (%s); remove it from their config first", job, strings.Join(f.members, ", "))
	}
	if len(f.running) > 0 {
		return 0, opErr(ErrRefused, "items of job %q are still running (%v); wait for them to end", job, f.running)
	}
	if f.leaders > 0 {
		return 0, opErr(ErrRefused, "an instance still leads or campaigns for job %q (it is stopping); try again in a moment", job)
	}
	resp, err := c.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(c.keys.Members(job)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Running(job)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Leader(job)), "=", 0).WithPrefix(),
	).Then(clientv3.OpDelete(c.keys.JobPrefix(job), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Placement(job))).Commit()
	if err != nil {
		return 0, fmt.Errorf("remove job %q: %w", job, err)
	}
	if !resp.Succeeded {
		return 0, opErr(ErrRefused, "an instance joined job %q or ran one of its items meanwhile; nothing removed", job)
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted, nil
}
