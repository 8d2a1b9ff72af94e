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
}

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
	var rows []instanceRow
	for _, in := range snap.st.Instances {
		rows = append(rows, instanceRow{InstanceStatus: in, Items: items[in.ID], Leading: leading[in.ID]})
	}
	slices.SortFunc(rows, func(a, b instanceRow) int { return strings.Compare(a.ID, b.ID) })
	v.Data = instancesData{Rows: rows, Etcd: snap.st.Etcd, Problems: snap.st.Etcd.Problems()}
	return "instances", nil
}

// ---- audit
