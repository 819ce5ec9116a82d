package runner

import (
	"math/rand/v2"
	"net/url"
	"strings"
	"time"
)

// jitter spreads a periodic wait d (the host heartbeat, the sandbox sweep)
// by ±frac, so that a fleet does not poll in lockstep. The backoffs after
// failures take theirs from their ExponentialBackOff's randomisation
// factor (retry.Policy.Backoff).
func jitter(d time.Duration, frac float64) time.Duration {
	if frac <= 0 || d <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + frac*(2*rand.Float64()-1)))
}

// spread is a uniformly random wait in [0, d).
func spread(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// redactURLs is a comma-separated list of addresses, each redacted.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// redactURL is the control plane's address fit for a record: scheme, host
// and path, without credentials, query or fragment.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "unparseable"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
