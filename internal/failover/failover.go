// Package failover spreads a client's control-plane calls over several
// replicas' addresses (runnerd run --control-plane A,B): every call goes to
// the address in use; a transport failure or a 5xx answer moves the next
// calls to the next address; while another than the first (the preferred)
// is in use, the preferred one's /readyz is asked in the background, and
// calls return to it once it answers 200.
//
// A call is never sent twice here: the caller's retry policy decides
// whether to try again, and its next try goes to the next address. So the
// renewer's cadence, the receipts' rules and every other retry stay as
// they are; only where their tries go changes.
package failover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ProbeEvery is how often the preferred address is asked whether it
// answers again while another is in use.
const ProbeEvery = 5 * time.Second

// probeTimeout bounds one such question.
const probeTimeout = 5 * time.Second

// Endpoints is one process's view of which replica it talks to. Its
// transports share it, so a failure seen by one moves them all.
type Endpoints struct {
	urls []*url.URL // in preference order
	raw  []string
	cur  atomic.Int32 // index of the address in use

	// probeMu guards probing and lastProbe: at most one question to the
	// preferred address at a time, one per ProbeEvery.
	probeMu   sync.Mutex
	probing   bool
	lastProbe time.Time
	// onSwitch, when set, is told of every change of address (from, to).
	onSwitch func(from, to string)
	// probeEvery is how often the preferred address is asked (ProbeEvery).
	probeEvery time.Duration
}

// Parse reads a comma-separated list of http:// or https:// base URLs;
// errors name the bad entry.
func Parse(list string) (*Endpoints, error) {
	e := &Endpoints{probeEvery: ProbeEvery}
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		u, err := url.Parse(s)
		if s == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("%q: want an http:// or https:// URL", s)
		}
		u.Path = strings.TrimSuffix(u.Path, "/")
		key := u.String()
		if seen[key] {
			return nil, fmt.Errorf("%q is given twice", s)
		}
		seen[key] = true
		e.urls = append(e.urls, u)
		e.raw = append(e.raw, s)
	}
	return e, nil
}

// SetProbeEvery changes how often the preferred address is asked while
// another is in use; call it before the first call.
func (e *Endpoints) SetProbeEvery(d time.Duration) { e.probeEvery = d }

// OnSwitch sets a function told of every change of address; call it
// before the first call.
func (e *Endpoints) OnSwitch(f func(from, to string)) { e.onSwitch = f }

// Base is the preferred address: the BaseURL of the clients whose
// transports Transport wraps.
func (e *Endpoints) Base() string { return e.urls[0].String() }

// Len is the number of addresses.
func (e *Endpoints) Len() int { return len(e.urls) }

// Current is the address in use.
func (e *Endpoints) Current() string { return e.urls[e.cur.Load()].String() }

// Transport sends each request, addressed to Base, to the address in use
// over base.
func (e *Endpoints) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{e: e, base: base}
}

type transport struct {
	e    *Endpoints
	base http.RoundTripper
}

// CloseIdleConnections passes on to base (the renewer closes them after
// failures).
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	e := t.e
	i := e.cur.Load()
	if i != 0 {
		e.maybeProbe(t.base)
	}
	out := req.Clone(req.Context())
	out.URL = e.address(int(i), req.URL)
	out.Host = ""
	resp, err := t.base.RoundTrip(out)
	switch {
	case err != nil && req.Context().Err() == nil && !errors.Is(err, context.Canceled):
		e.failed(i)
	case err == nil && resp.StatusCode >= 500:
		e.failed(i)
	}
	return resp, err
}

// address is u, addressed to the preferred base, readdressed to urls[i].
func (e *Endpoints) address(i int, u *url.URL) *url.URL {
	to := *u
	if i == 0 {
		return &to
	}
	pref, target := e.urls[0], e.urls[i]
	to.Scheme, to.Host = target.Scheme, target.Host
	to.Path = target.Path + strings.TrimPrefix(u.Path, pref.Path)
	to.RawPath = ""
	return &to
}

// failed moves the calls on from address i, unless another call moved
// them already.
func (e *Endpoints) failed(i int32) {
	if len(e.urls) < 2 {
		return
	}
	next := (i + 1) % int32(len(e.urls))
	if e.cur.CompareAndSwap(i, next) && e.onSwitch != nil {
		e.onSwitch(e.raw[i], e.raw[next])
	}
}

// maybeProbe asks the preferred address's /readyz in the background, at
// most once per ProbeEvery; a 200 brings the calls back to it.
func (e *Endpoints) maybeProbe(base http.RoundTripper) {
	e.probeMu.Lock()
	if e.probing || time.Since(e.lastProbe) < e.probeEvery {
		e.probeMu.Unlock()
		return
	}
	e.probing, e.lastProbe = true, time.Now()
	e.probeMu.Unlock()
	go func() {
		defer func() {
			e.probeMu.Lock()
			e.probing = false
			e.probeMu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.urls[0].String()+"/readyz", nil)
		if err != nil {
			return
		}
		resp, err := base.RoundTrip(req)
		if err != nil {
			return
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			if from := e.cur.Swap(0); from != 0 && e.onSwitch != nil {
				e.onSwitch(e.raw[from], e.raw[0])
			}
		}
	}()
}
