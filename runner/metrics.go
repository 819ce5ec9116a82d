package runner

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runnerd/runnerd/diagnostics"
)

// Metrics are the daemon's Prometheus series. NewMetrics registers them on
// the registry the caller owns (cmd serves it), so tests can use their own.
type Metrics struct {
	LeasesHeld     prometheus.Gauge
	Renewals       *prometheus.CounterVec // by result class
	LaunchFailures *prometheus.CounterVec // by class
	Turns          *prometheus.CounterVec // by outcome
	ClaimToAccept  prometheus.Histogram
}

// NewMetrics creates the series and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		LeasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "runnerd_leases_held", Help: "Attempt leases this daemon holds now.",
		}),
		Renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_renewals_total", Help: "Lease renewals by result class.",
		}, []string{"result"}),
		LaunchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_launch_failures_total", Help: "Turn launches that failed before acceptance, by class.",
		}, []string{"class"}),
		Turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runnerd_turns_total", Help: "Turns ended, by outcome.",
		}, []string{"outcome"}),
		ClaimToAccept: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runnerd_claim_to_accept_seconds",
			Help:    "Time from a claim to the child's ACCEPT.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.LeasesHeld, m.Renewals, m.LaunchFailures, m.Turns, m.ClaimToAccept)
	}
	return m
}

// countRenewals counts renewal answers by result class ("ok", "http_409",
// "timeout", …) as they happen: it wraps the renewal client's transport,
// which carries nothing but renewals.
type countRenewals struct {
	base http.RoundTripper
	m    *Metrics
}

func (c countRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
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
