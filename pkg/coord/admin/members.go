package admin

// The etcd cluster's own health, as shardd status and the console show it:
// each member, whether it answers, which one leads, its database's size,
// and how many more members may fail before the cluster loses its quorum
// (and shardd, with it, every claim and outcome).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// memberTimeout bounds the status read of one member: a member that does
// not answer in it is down, as far as status can tell.
const memberTimeout = time.Second

// EtcdMember is one member of the etcd cluster.
type EtcdMember struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	ClientURLs []string `json:"clientURLs"`
	Learner    bool     `json:"learner,omitempty"`
	// Up says the member answered a status read; Error why not.
	Up    bool   `json:"up"`
	Error string `json:"error,omitempty"`
	// Leader says it is the raft leader (as the members that answered say);
	// NoLeader that it answered but knows no leader (cut off from the
	// others, or an election goes on): it takes no writes.
	Leader   bool `json:"leader,omitempty"`
	NoLeader bool `json:"noLeader,omitempty"`
	// DBSize is its database's size on disk, DBSizeInUse what of it holds
	// data (the rest is freed by a defragmentation), in bytes.
	DBSize      int64  `json:"dbSize,omitempty"`
	DBSizeInUse int64  `json:"dbSizeInUse,omitempty"`
	Version     string `json:"version,omitempty"`
}

// EtcdHealth is the etcd cluster's health.
type EtcdHealth struct {
	Members []EtcdMember `json:"members"`
	// Voters counts the voting members (learners do not vote), Up those of
	// them that answered and know a leader, Quorum how many must be up for
	// etcd to take writes.
	Voters int `json:"voters"`
	Up     int `json:"up"`
	Quorum int `json:"quorum"`
	// FaultTolerance is how many more voting members may fail with the
	// quorum kept; negative when it is lost already.
	FaultTolerance int `json:"faultTolerance"`
	// Error says why the members could not be listed.
	Error string `json:"error,omitempty"`
}

// EtcdHealth reads the members of the etcd cluster and asks each for its
// status, side by side, each within memberTimeout, at its client URLs: a
// member that does not answer from here is down as far as this host can
// tell (etcdctl endpoint health --cluster judges the same way).
func (c *Client) EtcdHealth(ctx context.Context) *EtcdHealth {
	lctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	resp, err := c.cli.MemberList(lctx)
	if err != nil {
		return &EtcdHealth{Error: fmt.Sprintf("list the members: %v", err)}
	}
	h := &EtcdHealth{Members: make([]EtcdMember, len(resp.Members))}
	var leader uint64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, m := range resp.Members {
		em := EtcdMember{ID: fmt.Sprintf("%x", m.ID), Name: m.Name, ClientURLs: m.ClientURLs, Learner: m.IsLearner}
		h.Members[i] = em
		if len(m.ClientURLs) == 0 {
			h.Members[i].Error = "not started (no client URL yet)"
			continue
		}
		wg.Go(func() {
			var errs []string
			for _, u := range m.ClientURLs {
				sctx, cancel := context.WithTimeout(ctx, memberTimeout)
				st, err := c.cli.Status(sctx, u)
				cancel()
				if err != nil {
					errs = append(errs, fmt.Sprintf("%s: %v", u, err))
					continue
				}
				mu.Lock()
				defer mu.Unlock()
				h.Members[i].Up, h.Members[i].DBSize, h.Members[i].DBSizeInUse, h.Members[i].Version = true, st.DbSize, st.DbSizeInUse, st.Version
				if st.Leader != 0 {
					leader = st.Leader
				} else {
					h.Members[i].NoLeader = true
				}
				return
			}
			mu.Lock()
			h.Members[i].Error = strings.Join(errs, "; ")
			mu.Unlock()
		})
	}
	wg.Wait()
	for i, m := range resp.Members {
		h.Members[i].Leader = m.ID == leader
		if !m.IsLearner {
			h.Voters++
			if h.Members[i].Up && !h.Members[i].NoLeader {
				h.Up++
			}
		}
	}
	h.Quorum = h.Voters/2 + 1
	h.FaultTolerance = h.Up - h.Quorum
	return h
}

// Problems says what is wrong with the etcd cluster: members down, the
// quorum at stake or lost.
func (h *EtcdHealth) Problems() []string {
	if h == nil {
		return nil
	}
	if h.Error != "" {
		return []string{"etcd members: " + h.Error}
	}
	var out []string
	for _, m := range h.Members {
		switch {
		case !m.Up:
			out = append(out, fmt.Sprintf("etcd member %s (%s) is down (it does not answer from here): %s", m.Name, m.ID, m.Error))
		case m.NoLeader:
			out = append(out, fmt.Sprintf("etcd member %s (%s) answers but knows no leader: it is cut off from the others, or an election goes on", m.Name, m.ID))
		}
	}
	switch {
	case h.FaultTolerance < 0:
		out = append(out, fmt.Sprintf("etcd has lost its quorum: %d of %d voting members answer, %d needed; no run starts or is recorded until it is back", h.Up, h.Voters, h.Quorum))
	case h.FaultTolerance == 0 && h.Voters > 1:
		out = append(out, fmt.Sprintf("etcd tolerates no more failures: %d of %d voting members answer; one more down and it loses its quorum", h.Up, h.Voters))
	}
	return out
}
