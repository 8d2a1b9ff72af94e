package console

import (
	"net/http"
	"slices"
	"strings"

	"github.com/shardd/shardd/pkg/coord/admin"
)

type instancesData struct {
	Rows []instanceRow
	// Etcd is the etcd cluster's members and fault tolerance (nil: not read).
	Etcd     *admin.EtcdHealth
	Problems []string
}

type instanceRow struct {
	admin.InstanceStatus
	Items   int
	Leading int
	// Running are the items it runs now (job and item), the first
	// maxRunningShown of them; RunningCount all of them.
	Running      []runningItem
	RunningCount int
}

type runningItem struct {
	Job  string
	Item int
}

// maxRunningShown bounds the items an instance's row names.
const maxRunningShown = 10

func (c *console) instances(r *http.Request, v *view) (string, error) {
	snap, err := c.snapshot(r, v, "Instances", "instances")
	if err != nil {
		return "", err
	}
	items, leading := map[string]int{}, map[string]int{}
	for _, j := range snap.st.Jobs {
		leading[j.Leader]++
		for _, it := range j.Items {
			items[it.Instance]++
		}
	}
	running := map[string][]runningItem{}
	for job, jr := range snap.runs {
		for item, inst := range jr.Running {
			running[inst] = append(running[inst], runningItem{Job: job, Item: item})
		}
	}
	var rows []instanceRow
	for _, in := range snap.st.Instances {
		now := running[in.ID]
		slices.SortFunc(now, func(a, b runningItem) int {
			if c := strings.Compare(a.Job, b.Job); c != 0 {
				return c
			}
			return a.Item - b.Item
		})
		row := instanceRow{InstanceStatus: in, Items: items[in.ID], Leading: leading[in.ID], RunningCount: len(now)}
		row.Running = now[:min(len(now), maxRunningShown)]
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b instanceRow) int { return strings.Compare(a.ID, b.ID) })
	v.Data = instancesData{Rows: rows, Etcd: snap.st.Etcd, Problems: snap.st.Etcd.Problems()}
	return "instances", nil
}

// ---- audit
