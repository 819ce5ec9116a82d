package controlplane

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Metrics are the control plane's Prometheus series. NewMetrics registers
// them on the caller's registry; cmd/controlplane serves it at /metrics.
// The counters of the worker API are read off each answer's route and
// status, so no handler can forget one; the gauges of the store (jobs by
// state, live leases, hosts by state) are read from it at scrape time, so
// every replica shows the whole fleet.
type Metrics struct {
	requests     *prometheus.HistogramVec // route, status
	claims       *prometheus.CounterVec   // result
	claimedTurns prometheus.Counter
	claimPolls   prometheus.Gauge
	claimWakes   *prometheus.CounterVec   // by (signal, recheck)
	renewals     *prometheus.CounterVec   // status
	finishes     *prometheus.CounterVec   // op (finish, abandon), status
	releases     *prometheus.CounterVec   // status
	staleReports *prometheus.CounterVec   // op
	reaped       *prometheus.CounterVec   // what
	storeTx      *prometheus.HistogramVec // result
	batches      prometheus.Counter
	batchItems   *prometheus.CounterVec // op, status

	server atomic.Pointer[Server] // the server whose store the gauges read; set by New
}

// statsTimeout bounds the store's part of one scrape.
const statsTimeout = 5 * time.Second

var (
	descJobs       = prometheus.NewDesc("controlplane_jobs", "Jobs by state, from the store.", []string{"state"}, nil)
	descJobCauses  = prometheus.NewDesc("controlplane_jobs_by_cause", "Jobs that ended failed or cancelled, by the cause of their end (S5: the closed list, every cause shown), from the store.", []string{"cause"}, nil)
	descLeases     = prometheus.NewDesc("controlplane_leases_live", "Attempts running now (live leases), from the store.", nil, nil)
	descHosts      = prometheus.NewDesc("controlplane_hosts", "Hosts not removed, by state (online, offline, draining, paused).", []string{"state"}, nil)
	descStoreStats = prometheus.NewDesc("controlplane_store_stats_up", "1 when the store answered this scrape's questions, else 0 and the store gauges are absent.", nil, nil)
)

// NewMetrics creates the series and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "controlplane_http_request_duration_seconds",
			Help:    "Time to answer a request, by route pattern and status; long polls included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"route", "status"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_claims_total", Help: "Claim answers: granted, empty (the long poll ended with nothing), refused (4xx), failed (5xx).",
		}, []string{"result"}),
		claimedTurns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controlplane_claimed_turns_total", Help: "Turns handed out by claims: one per attempt of a granted claim or batch, replays included.",
		}),
		claimPolls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "controlplane_claim_polls_waiting", Help: "Claim long polls of this replica waiting for work now.",
		}),
		claimWakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_claim_wakes_total", Help: "Waiting claim long polls that asked the store again: by the store's signal of new work, or by the slow re-check.",
		}, []string{"by"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_renewals_total", Help: "Lease renewal answers by status.",
		}, []string{"status"}),
		finishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_finishes_total", Help: "Terminal reports (finish, abandon) by status.",
		}, []string{"op", "status"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_releases_total", Help: "Releases of never-accepted claims by status.",
		}, []string{"status"}),
		staleReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_stale_reports_total", Help: "Attempt-scoped writes refused because the attempt no longer held the lease (409 lease_lost), by operation.",
		}, []string{"op"}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_reaped_total", Help: "What the reaper did: superseded attempts, requeued jobs, conversations lost, jobs failed at the worker-lost cap, settled turns ended without their finish.",
		}, []string{"what"}),
		storeTx: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "controlplane_store_tx_duration_seconds",
			Help:    "Duration of the store's write transactions (with the wait for SQLite's single writer), by result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"result"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controlplane_worker_batches_total", Help: "Worker batch requests (POST " + wire.PathWorkerBatch + ") answered item by item.",
		}),
		batchItems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controlplane_worker_batch_items_total", Help: "Items of worker batch requests, by operation and the item's own status.",
		}, []string{"op", "status"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.claims, m.claimedTurns, m.claimPolls, m.claimWakes, m.renewals, m.finishes, m.releases, m.staleReports, m.reaped, m.storeTx,
			m.batches, m.batchItems, storeCollector{m})
	}
	return m
}

// ObserveTx is the store's transaction observer (sqlstore.WithTxObserver).
func (m *Metrics) ObserveTx(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error" // a refused write (409) is an error here too
	}
	m.storeTx.WithLabelValues(result).Observe(d.Seconds())
}

func (m *Metrics) reap(res store.ReapResult) {
	for what, n := range map[string]int{"superseded": res.Superseded, "requeued": res.Requeued,
		"conversations_quarantined": res.ConversationsQuarantined, "failed_worker_lost_cap": res.FailedWorkerLostCap,
		"reports_missing": res.ReportsMissing} {
		m.reaped.WithLabelValues(what).Add(float64(n))
	}
}

// Route patterns whose answers are counted besides being timed.
var (
	routeClaim   = "POST " + wire.PathClaim
	routeRenew   = "POST " + wire.AttemptPath("{job}", wire.OpRenew)
	routeFinish  = "POST " + wire.AttemptPath("{job}", wire.OpFinish)
	routeAbandon = "POST " + wire.AttemptPath("{job}", wire.OpAbandon)
	routeRelease = "POST " + wire.AttemptPath("{job}", wire.OpRelease)
)

// instrument times every request by the pattern the mux matched (never
// the path, which holds ids) and its status, and counts the worker API's
// answers.
func (m *Metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		code := strconv.Itoa(status)
		route := r.Pattern // set by the mux on r itself
		if route == "" {
			route = "unmatched" // refused before the mux, as a path it does not serve
		}
		m.requests.WithLabelValues(route, code).Observe(time.Since(start).Seconds())
		m.countAnswer(route, status)
	})
}

// countAnswer counts a worker API answer of route, the per-call request's
// or a batch item's.
func (m *Metrics) countAnswer(route string, status int) {
	code := strconv.Itoa(status)
	switch route {
	case routeClaim:
		m.claims.WithLabelValues(claimResult(status)).Inc()
	case routeRenew:
		m.renewals.WithLabelValues(code).Inc()
	case routeFinish:
		m.finishes.WithLabelValues(wire.OpFinish, code).Inc()
	case routeAbandon:
		m.finishes.WithLabelValues(wire.OpAbandon, code).Inc()
	case routeRelease:
		m.releases.WithLabelValues(code).Inc()
	}
}

func claimResult(status int) string {
	switch {
	case status == http.StatusOK:
		return "granted"
	case status == http.StatusNoContent:
		return "empty"
	case status < 500:
		return "refused"
	}
	return "failed"
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the real writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// storeCollector reads the store's gauges at scrape time.
type storeCollector struct{ m *Metrics }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descJobs
	ch <- descJobCauses
	ch <- descLeases
	ch <- descHosts
	ch <- descStoreStats
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.server.Load()
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), statsTimeout)
	defer cancel()
	st, err := s.cfg.Store.Stats(ctx)
	var servers []wire.Server
	if err == nil {
		servers, err = s.cfg.Store.ListServers(ctx)
	}
	var now time.Time // a host's state is judged on the store's clock (K3)
	if err == nil {
		now, err = s.cfg.Store.Now(ctx)
	}
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descStoreStats, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoreStats, prometheus.GaugeValue, 1)
	for state, n := range st.JobsByState {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(n), state)
	}
	for _, cause := range wire.Causes {
		ch <- prometheus.MustNewConstMetric(descJobCauses, prometheus.GaugeValue, float64(st.JobsByCause[cause]), string(cause))
	}
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(st.LiveLeases))
	hosts := map[string]int{wire.HostOnline: 0, wire.HostOffline: 0, wire.HostDraining: 0, wire.HostPaused: 0}
	for _, sv := range servers {
		hosts[wire.HostState(sv, now)]++
	}
	for state, n := range hosts {
		ch <- prometheus.MustNewConstMetric(descHosts, prometheus.GaugeValue, float64(n), state)
	}
}
