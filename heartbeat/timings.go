package heartbeat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Defaults (R1–R4).
const (
	DefaultLeaseTTL       = 120 * time.Second
	DefaultInterval       = 30 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	DefaultRetryDelay     = 5 * time.Second
)

// Timings are the renewal timings. Zero fields mean the default.
type Timings struct {
	LeaseTTL       time.Duration // the lease the runner asks for and the cap on what it counts with
	Interval       time.Duration // between an acknowledged renewal and the next
	RequestTimeout time.Duration // overall limit of one renewal request
	RetryDelay     time.Duration // after a failed renewal
}

func (t Timings) withDefaults() Timings {
	if t.LeaseTTL <= 0 {
		t.LeaseTTL = DefaultLeaseTTL
	}
	if t.Interval <= 0 {
		t.Interval = DefaultInterval
	}
	if t.RequestTimeout <= 0 {
		t.RequestTimeout = DefaultRequestTimeout
	}
	if t.RetryDelay <= 0 {
		t.RetryDelay = DefaultRetryDelay
	}
	return t
}

// MinLeaseTTL is the shortest lease the timings allow: one interval plus one
// request timeout (R12), 40 s at the defaults.
func (t Timings) MinLeaseTTL() time.Duration {
	t = t.withDefaults()
	return t.Interval + t.RequestTimeout
}

// TimingInputs are the start-up values as cmd/runnerd reads them; errors
// name the daemon's flags (--lease-ttl, --renew-interval, --renew-timeout,
// --renew-retry). Zero durations mean "not given".
type TimingInputs struct {
	LeaseTTLFlag    time.Duration // --lease-ttl
	LeaseTTLFlagSet bool          // whether --lease-ttl was given
	LeaseTTLEnv     string        // AGENT_LEASE_TTL as read; "" when unset
	Interval        time.Duration // --renew-interval
	RequestTimeout  time.Duration // --renew-timeout
	RetryDelay      time.Duration // --renew-retry
}

// Warning is a setting that was ignored in favour of a default. The daemon
// logs each with diagnostics.Recorder.ConfigIgnored.
type Warning struct {
	Setting string        // "AGENT_LEASE_TTL"
	Given   time.Duration // zero when the value could not be read
	Used    time.Duration
	Reason  string // fixed phrase, never the raw value
}

// EnvLeaseTTL is the environment variable ResolveTimings interprets.
const EnvLeaseTTL = "AGENT_LEASE_TTL"

// ResolveTimings applies R12 at start-up: the lease must be at least one
// interval plus one request timeout. A --lease-ttl shorter than that is an
// error (the daemon exits non-zero); an AGENT_LEASE_TTL shorter than that, or
// unreadable, is ignored for the default with a Warning. The flag wins over
// the environment. AGENT_LEASE_TTL is a Go duration ("90s") or whole seconds
// ("90"), at most a day. Negative interval, timeout and retry values are
// errors, and so is a retry delay longer than the interval.
func ResolveTimings(in TimingInputs) (Timings, []Warning, error) {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"--renew-interval", in.Interval},
		{"--renew-timeout", in.RequestTimeout},
		{"--renew-retry", in.RetryDelay},
	} {
		if f.v < 0 {
			return Timings{}, nil, fmt.Errorf("%s %v: must be positive", f.name, f.v)
		}
	}
	t := Timings{Interval: in.Interval, RequestTimeout: in.RequestTimeout, RetryDelay: in.RetryDelay}.withDefaults()
	if t.RetryDelay > t.Interval {
		return Timings{}, nil, fmt.Errorf("--renew-retry %v is longer than --renew-interval %v", t.RetryDelay, t.Interval)
	}
	minTTL := t.MinLeaseTTL()
	if in.LeaseTTLFlagSet {
		if in.LeaseTTLFlag < minTTL {
			return Timings{}, nil, fmt.Errorf("--lease-ttl %v is shorter than the heartbeat interval plus the request timeout (%v + %v = %v): the lease could expire before a renewal is answered",
				in.LeaseTTLFlag, t.Interval, t.RequestTimeout, minTTL)
		}
		t.LeaseTTL = in.LeaseTTLFlag
		return t, nil, nil
	}
	var warnings []Warning
	if in.LeaseTTLEnv != "" {
		v, err := parseTTL(in.LeaseTTLEnv)
		switch {
		case err != nil:
			warnings = append(warnings, Warning{Setting: EnvLeaseTTL, Used: DefaultLeaseTTL, Reason: "not a duration"})
		case v < minTTL:
			warnings = append(warnings, Warning{Setting: EnvLeaseTTL, Given: v, Used: DefaultLeaseTTL, Reason: "shorter than heartbeat interval plus request timeout"})
		default:
			t.LeaseTTL = v
		}
	}
	if t.LeaseTTL < minTTL {
		return Timings{}, nil, fmt.Errorf("default lease %v is shorter than the heartbeat interval plus the request timeout (%v + %v = %v): shorten those or pass a longer --lease-ttl",
			t.LeaseTTL, t.Interval, t.RequestTimeout, minTTL)
	}
	return t, warnings, nil
}

// maxLeaseTTL bounds AGENT_LEASE_TTL: a day is already far past any sane lease.
const maxLeaseTTL = 24 * time.Hour

func parseTTL(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n <= 0 || n > int64(maxLeaseTTL/time.Second) {
			return 0, errors.New("out of range")
		}
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, err
	}
	if d <= 0 || d > maxLeaseTTL {
		return 0, errors.New("out of range")
	}
	return d, nil
}
