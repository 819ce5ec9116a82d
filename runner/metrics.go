package runner

import (
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/runner/turn"
)

// Metrics are the daemon's Prometheus series. NewMetrics registers them on
// the registry the caller owns (cmd serves it), so tests can use their own.
// The gauges of the daemon's state (slots, leases, paused, draining) are
// read at scrape time from the daemon New binds them to.
type Metrics struct {
	Renewals       *prometheus.CounterVec // by result class
	RenewalLatency prometheus.Histogram   // send to answer of each renewal, whatever the answer
	LaunchFailures *prometheus.CounterVec // by class, declines included
	Declines       *prometheus.CounterVec // the child's DECLINE, by class
	ClaimFailures  *prometheus.CounterVec // failed claim requests, by class
	Turns          *prometheus.CounterVec // by outcome
	TurnDuration   *prometheus.HistogramVec
	ClaimToAccept  prometheus.Histogram // from the claim's answer to the child's ACCEPT
	ClaimWait      prometheus.Histogram // a claim's first request to the answer that brought turns, per turn
	QueueWait      prometheus.Histogram // a turn's message to its claim, on the store's clock (wire.Claim.QueuedMS)
	// SandboxEvictions counts idle evictions (S1) by result: evicted, or
	// the class of the one that did not happen.
	SandboxEvictions *prometheus.CounterVec
	// SandboxTeardown times each teardown (S6: idle, pressure, delete)
	// from its request to its proof or its budget's end;
	// SandboxTeardownIncomplete counts those not proven, by reason (the
	// teardown).
	SandboxTeardown           *prometheus.HistogramVec
	SandboxTeardownIncomplete *prometheus.CounterVec
	// SpareChildren counts spare turn children by how each ended its wait:
	// handed (a claim's payload), or discarded unused (exited, outdated,
	// assign_failed, stopped). runnerd_spare_ready is the gauge.
	SpareChildren *prometheus.CounterVec
	// ImagePulls counts the image pulls of turns' sandboxes (docker
	// --pull) by result, pulled or failed; ImagePullDuration times the
	// ones that were made.
	ImagePulls        *prometheus.CounterVec
	ImagePullDuration prometheus.Histogram

	daemon atomic.Pointer[Daemon] // set once by New; nil: the state gauges are absent

	mu     sync.Mutex                   // guards leases and nextID
	leases map[int]func() time.Duration // how long each held lease has left
	nextID int
}

// Names of the series read at scrape time.
const (
	metricLeasesHeld     = "runnerd_leases_held"
	metricLeaseMarginMin = "runnerd_lease_margin_min_seconds"
	metricSlots          = "runnerd_slots"
	metricSlotsBusy      = "runnerd_slots_busy"
	metricClaimsPaused   = "runnerd_claims_paused"
	metricDraining       = "runnerd_draining"
	metricSpareReady     = "runnerd_spare_ready"
)

var (
	descLeasesHeld = prometheus.NewDesc(metricLeasesHeld, "Attempt leases this daemon holds now.", nil, nil)
	descMargin     = prometheus.NewDesc(metricLeaseMarginMin,
		"Smallest time left, as the daemon counts it, before a lease it holds expires; absent when none is held.", nil, nil)
	descSlots     = prometheus.NewDesc(metricSlots, "Turns this daemon may run at once (--capacity).", nil, nil)
	descSlotsBusy = prometheus.NewDesc(metricSlotsBusy, "Slots taken now by running attempts and a claim in flight.", nil, nil)
	descPaused    = prometheus.NewDesc(metricClaimsPaused,
		"1 for the reason claiming is paused now, 0 for the others.", []string{"reason"}, nil)
	descDraining = prometheus.NewDesc(metricDraining, "1 once a drain began.", nil, nil)
	descSpare    = prometheus.NewDesc(metricSpareReady,
		"1 while a spare turn child waits for a claim's payload (it takes no slot of --capacity), 0 otherwise.", nil, nil)
)

// NewMetrics creates the series and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_renewals_total", Help: "Lease renewals by result class.",
		}, []string{"result"}),
		RenewalLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_renewal_latency_seconds",
			Help:    "Time from sending a lease renewal to its answer or failure.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		LaunchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_launch_failures_total", Help: "Turn launches that failed before acceptance, by class (declines included).",
		}, []string{"class"}),
		Declines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_declines_total", Help: "Turns the child declined before ACCEPT, by class.",
		}, []string{"class"}),
		ClaimFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_claim_failures_total", Help: "Claim requests that failed (not an empty long poll), by class.",
		}, []string{"class"}),
		Turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_turns_total", Help: "Turns ended, by outcome.",
		}, []string{"outcome"}),
		TurnDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "runnerd_turn_duration_seconds",
			Help:    "Time from the claim's answer to the turn's end (its report acknowledged, or it was let go), by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}, []string{"outcome"}),
		ClaimToAccept: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_claim_to_accept_seconds",
			Help:    "Time from the claim's answer to the child's ACCEPT.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		ClaimWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_claim_wait_seconds",
			Help:    "Time from a claim's first request (free slots asking for work) to the answer that brought turns, one observation per turn claimed.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
		QueueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_queue_wait_seconds",
			Help:    "Time a claimed turn waited between its message and its claim, on the control plane's store clock; one observation per turn claimed (none from a control plane that does not say).",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 20),
		}),
		SandboxEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_sandbox_evictions_total", Help: "Idle sandboxes stopped and kept (result evicted), or left running (result: why).",
		}, []string{"result"}),
		SandboxTeardown: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "runnerd_sandbox_teardown_seconds",
			Help:    "Time a sandbox teardown (idle or pressure eviction, deletion) took from its request to the proof that its processes are gone, or to its budget's end, by teardown.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"teardown"}),
		SandboxTeardownIncomplete: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_sandbox_teardown_incomplete_total", Help: "Sandbox teardowns that did not prove the sandbox's processes gone within --teardown-budget (sandbox_teardown_incomplete), by reason: the teardown (idle, pressure, delete; a turn's cancel or fence, as its supervisor recorded it).",
		}, []string{"reason"}),
		SpareChildren: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_spare_children_total", Help: "Spare turn children (started before a claim, no slot of --capacity), by how their wait ended: handed a claim's payload, or discarded unused (exited, outdated, assign_failed, stopped).",
		}, []string{"end"}),
		ImagePulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_image_pulls_total", Help: "Image pulls made to create turns' sandboxes (docker --pull), by result: pulled or failed.",
		}, []string{"result"}),
		ImagePullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_image_pull_seconds",
			Help:    "Time an image pull took, of the ones made.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}),
		leases: map[int]func() time.Duration{},
	}
	if reg != nil {
		reg.MustRegister(m.Renewals, m.RenewalLatency, m.LaunchFailures, m.Declines, m.ClaimFailures,
			m.Turns, m.TurnDuration, m.ClaimToAccept, m.ClaimWait, m.QueueWait, m.SandboxEvictions, m.SandboxTeardown, m.SandboxTeardownIncomplete, m.SpareChildren,
			m.ImagePulls, m.ImagePullDuration, stateCollector{m})
	}
	return m
}

// holdLease counts a held lease, whose time left left reports, until the
// returned func is called.
func (m *Metrics) holdLease(left func() time.Duration) (release func()) {
	m.mu.Lock()
	id := m.nextID
	m.nextID++
	m.leases[id] = left
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.leases, id)
		m.mu.Unlock()
	}
}

// turnEnded counts a turn's end and how long it was held since claimedAt.
func (m *Metrics) turnEnded(outcome string, claimedAt time.Time) {
	m.Turns.WithLabelValues(outcome).Inc()
	if !claimedAt.IsZero() {
		m.TurnDuration.WithLabelValues(outcome).Observe(time.Since(claimedAt).Seconds())
	}
}

// imagePull counts a turn's image pull (nil: it made none).
func (m *Metrics) imagePull(p *turn.ImagePull) {
	switch {
	case p == nil:
	case p.Failed:
		m.ImagePulls.WithLabelValues("failed").Inc()
	default:
		m.ImagePulls.WithLabelValues("pulled").Inc()
		m.ImagePullDuration.Observe(float64(p.DurationMS) / 1000)
	}
}

// launchFailed counts a launch failure, and a decline besides when it was one.
func (m *Metrics) launchFailed(outcome, class string) {
	m.LaunchFailures.WithLabelValues(class).Inc()
	if outcome == handover.OutcomeDeclined.String() {
		m.Declines.WithLabelValues(strings.TrimPrefix(class, "declined:")).Inc()
	}
}

// claimFailed counts a failed claim request by its class.
func (m *Metrics) claimFailed(err error) {
	m.ClaimFailures.WithLabelValues(diagnostics.Class(err)).Inc()
}

// stateCollector reads the daemon's state at scrape time.
type stateCollector struct{ m *Metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeasesHeld, descMargin, descSlots, descSlotsBusy, descPaused, descDraining, descSpare} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	c.m.mu.Lock()
	held := len(c.m.leases)
	margin := math.Inf(1)
	for _, left := range c.m.leases {
		margin = math.Min(margin, left().Seconds())
	}
	c.m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descLeasesHeld, prometheus.GaugeValue, float64(held))
	if !math.IsInf(margin, 1) {
		ch <- prometheus.MustNewConstMetric(descMargin, prometheus.GaugeValue, margin)
	}
	d := c.m.daemon.Load()
	if d == nil {
		return
	}
	s := d.status(now)
	ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(s.capacity))
	ch <- prometheus.MustNewConstMetric(descSlotsBusy, prometheus.GaugeValue, float64(s.busy))
	for _, r := range pauseReasons {
		v := 0.0
		if s.paused == r {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, v, string(r))
	}
	v := 0.0
	if s.draining {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, v)
	v = 0
	if d.spareReady() {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(descSpare, prometheus.GaugeValue, v)
}

// countRenewals counts renewal answers by result class ("ok", "http_409",
// "timeout", …) and times them as they happen: it wraps the renewal
// client's transport, which carries nothing but renewals.
type countRenewals struct {
	base http.RoundTripper
	m    *Metrics
}

// CloseIdleConnections passes on to base: the renewer closes its idle
// connections after failures, so that a stuck one cannot hold renewals
// (heartbeat.NewHTTPClient); without this the wrapper would swallow it.
func (c countRenewals) CloseIdleConnections() {
	if ci, ok := c.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

func (c countRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := c.base.RoundTrip(r)
	c.m.RenewalLatency.Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		c.m.Renewals.WithLabelValues(diagnostics.Class(err)).Inc()
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		c.m.Renewals.WithLabelValues("ok").Inc()
	default:
		c.m.Renewals.WithLabelValues(diagnostics.StatusClass(resp.StatusCode)).Inc()
	}
	return resp, err
}
