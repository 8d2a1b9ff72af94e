// Package metrics defines shardd's Prometheus metrics. Every collector is
// registered on the Registerer given to New, never the global registry. No
// metric has a per-item label: a job with 10,000 items is still a handful of
// series. The job label is shardd_job, since Prometheus reserves job (and
// instance) for its scrape targets.
package metrics

import (
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds shardd's collectors.
type Metrics struct {
	Runs            *prometheus.CounterVec   // job, result, source
	RunDuration     *prometheus.HistogramVec // job
	TriggerDelay    *prometheus.HistogramVec // job
	Running         *prometheus.GaugeVec     // job
	SkippedFires    *prometheus.CounterVec   // job
	Reshards        *prometheus.CounterVec   // job
	SessionLosses   prometheus.Counter
	EtcdRequests    *prometheus.HistogramVec // operation, result
	ReloadSuccess   prometheus.Gauge
	ReloadTimestamp prometheus.Gauge
	EtcdExposed     *prometheus.GaugeVec // exposure
}

// Run results.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"
	ResultKilled  = "killed"
)

// New creates the collectors and registers them, with Go and process
// collectors and build information, on reg.
func New(reg prometheus.Registerer, version string) *Metrics {
	m := &Metrics{
		Runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardd_runs_total", Help: "Item executions finished on this instance, by job, result (success; failure: FAILED or timed out; killed: any other KILLED) and source (NORMAL, MISFIRE, FAILOVER, MANUAL).",
		}, []string{"shardd_job", "result", "source"}),
		RunDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "shardd_run_duration_seconds", Help: "Duration of item executions on this instance, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10ms .. ~43min
		}, []string{"shardd_job"}),
		TriggerDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "shardd_trigger_delay_seconds", Help: "Delay from an item's scheduled fire time to the start of its work.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"shardd_job"}),
		Running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardd_running_items", Help: "Items of the job running on this instance now.",
		}, []string{"shardd_job"}),
		SkippedFires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardd_skipped_fires_total", Help: "Fires not run by misfire policy (coalesced or dropped), as recorded by this instance.",
		}, []string{"shardd_job"}),
		Reshards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardd_reshards_total", Help: "Shard maps written by this instance as the job's leader.",
		}, []string{"shardd_job"}),
		SessionLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shardd_session_losses_total", Help: "etcd sessions this instance lost (it fenced itself and reconnected).",
		}),
		EtcdRequests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "shardd_etcd_request_duration_seconds", Help: "Latency of etcd requests by operation (gRPC method) and result (ok, error).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation", "result"}),
		ReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardd_config_last_reload_successful", Help: "Whether the last configuration reload succeeded (1) or failed (0).",
		}),
		ReloadTimestamp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardd_config_last_reload_success_timestamp_seconds", Help: "Time of the last successful configuration load.",
		}),
		EtcdExposed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shardd_etcd_exposed",
			Help: "1 when etcd, checked at start, is open in this way: anonymous (a client with no certificate and no user read shardd's keys, so anyone who reaches etcd can make every host run anything) or cleartext (an endpoint beyond loopback without TLS).",
		}, []string{"exposure"}),
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "shardd_build_info", Help: "Build information; the value is always 1.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Runs, m.RunDuration, m.TriggerDelay, m.Running, m.SkippedFires, m.Reshards,
		m.SessionLosses, m.EtcdRequests, m.ReloadSuccess, m.ReloadTimestamp, m.EtcdExposed, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// EtcdRequest records one etcd request.
func (m *Metrics) EtcdRequest(operation string, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.EtcdRequests.WithLabelValues(operation, result).Observe(d.Seconds())
}

// Reloaded records a configuration load.
func (m *Metrics) Reloaded(ok bool, at time.Time) {
	if ok {
		m.ReloadSuccess.Set(1)
		m.ReloadTimestamp.Set(float64(at.Unix()))
		return
	}
	m.ReloadSuccess.Set(0)
}

// JobState is what the state collector reads of one job at scrape time.
type JobState struct {
	Job        string
	ItemsOwned int
	Leading    bool
	Epoch      int64
	// Conflict: this host's definition differs from the registered one.
	Conflict bool
}

// State is what the state collector reads of the instance at scrape time.
type State struct {
	SessionUp bool
	// Rewound: etcd's history went back and the instance has not yet
	// recovered; NoSpace: etcd refused its last write for the NOSPACE alarm.
	Rewound, NoSpace bool
	Jobs             []JobState
}

// StateCollector exports gauges read at scrape time from the instance's
// state: session up, etcd's state as it sees it, and per job items owned,
// leadership and map epoch.
type StateCollector struct {
	read func() State

	up, rewound, noSpace, owned, leader, epoch, conflict *prometheus.Desc
}

// NewStateCollector returns a collector that calls read at every scrape.
func NewStateCollector(read func() State) *StateCollector {
	return &StateCollector{
		read: read,
		up:   prometheus.NewDesc("shardd_session_up", "Whether this instance holds a live etcd session (1) or not (0).", nil, nil),
		rewound: prometheus.NewDesc("shardd_etcd_rewound",
			"Whether etcd's history went back (a restore, a wipe, another cluster) and this instance, which starts no run meanwhile, has not yet recovered (1) or not (0).", nil, nil),
		noSpace: prometheus.NewDesc("shardd_etcd_nospace",
			"Whether etcd refused this instance's last write for its NOSPACE alarm (1): no run starts or is recorded until an operator frees space.", nil, nil),
		owned:  prometheus.NewDesc("shardd_items_owned", "Items of the job this instance owns in its current shard map.", []string{"shardd_job"}, nil),
		leader: prometheus.NewDesc("shardd_leader", "Whether this instance leads the job (1) or not (0).", []string{"shardd_job"}, nil),
		epoch:  prometheus.NewDesc("shardd_shard_map_epoch", "Epoch of the job's shard map as this instance last saw it.", []string{"shardd_job"}, nil),
		conflict: prometheus.NewDesc("shardd_job_definition_conflict",
			"Whether this host's definition of the job differs from the registered one, which it runs instead (1) or not (0).", []string{"shardd_job"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.rewound
	ch <- c.noSpace
	ch <- c.owned
	ch <- c.leader
	ch <- c.epoch
	ch <- c.conflict
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.read()
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, b2f(st.SessionUp))
	ch <- prometheus.MustNewConstMetric(c.rewound, prometheus.GaugeValue, b2f(st.Rewound))
	ch <- prometheus.MustNewConstMetric(c.noSpace, prometheus.GaugeValue, b2f(st.NoSpace))
	for _, j := range st.Jobs {
		ch <- prometheus.MustNewConstMetric(c.owned, prometheus.GaugeValue, float64(j.ItemsOwned), j.Job)
		ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, b2f(j.Leading), j.Job)
		ch <- prometheus.MustNewConstMetric(c.epoch, prometheus.GaugeValue, float64(j.Epoch), j.Job)
		ch <- prometheus.MustNewConstMetric(c.conflict, prometheus.GaugeValue, b2f(j.Conflict), j.Job)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
