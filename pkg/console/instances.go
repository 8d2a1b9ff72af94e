package console

import (
	"net/http"
	"slices"
	"strings"

	"github.com/shardd/shardd/pkg/coord/admin"
)

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
	v.Data = rows
	return "instances", nil
}

// ---- audit
