package settlement

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/runnerd/runnerd/wire"
)

// Defaults of the receipt retry policy (R24).
const (
	DefaultTries      = 3
	DefaultWait       = 5 * time.Second
	DefaultTryTimeout = 10 * time.Second
)

// Policy is the one retry policy of the attempt-scoped writes: up to Tries
// tries, each bounded by TryTimeout, Wait between them. Only transport
// failures and 408/502/503/504 are retried (wire.ClassifyStatus); 409 and
// 410 are definitive and every other status is final too. Zero fields mean
// the defaults.
type Policy struct {
	Tries      int
	Wait       time.Duration
	TryTimeout time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Tries <= 0 {
		p.Tries = DefaultTries
	}
	if p.Wait <= 0 {
		p.Wait = DefaultWait
	}
	if p.TryTimeout <= 0 {
		p.TryTimeout = DefaultTryTimeout
	}
	return p
}

// call is one logical call under the policy: it counts the tries, records
// each failed one, and remembers whether any try ended without a
// definitive answer (the request may have been applied).
type call struct {
	s      *Session
	op     string
	quiet  bool // record no failed try (the event uploader records outages itself)
	once   bool // one try only (the event uploader retries on its own cadence)
	tries  int
	unsure bool
}

// check is retryablehttp's CheckRetry, driven by wire.ClassifyStatus.
func (c *call) check(ctx context.Context, resp *http.Response, err error) (bool, error) {
	c.tries++
	if err != nil {
		if errors.Is(err, ErrLeaseRejected) {
			return false, err // never sent
		}
		if !isDial(err) {
			c.unsure = true
		}
		c.failed(err)
		if ctx.Err() != nil {
			return false, err // the caller gave up or the lease was rejected
		}
		return true, nil
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return false, nil
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusRequestTimeout {
		c.unsure = true // a 500 or a gateway answer may follow a commit
	}
	cls := wire.ClassifyStatus(resp.StatusCode)
	c.failed(&wire.StatusError{Op: c.op, Status: resp.StatusCode})
	return cls == wire.Transient && ctx.Err() == nil, nil
}

func (c *call) failed(err error) {
	if !c.quiet {
		c.s.recordControlFailure(c.op, err)
	}
}

// client is a wire.Client whose requests run under the policy for this call.
// retryablehttp drives the tries (its logger off); the inner http.Client
// bounds each try; the fence under it refuses every try after a lease
// rejection.
func (c *call) client() *wire.Client {
	p := c.s.cfg.Policy
	if c.once {
		p.Tries = 1
	}
	rc := &retryablehttp.Client{
		HTTPClient:   &http.Client{Transport: c.s.fence, Timeout: p.TryTimeout},
		Logger:       nil,
		RetryMax:     p.Tries - 1,
		RetryWaitMin: p.Wait,
		RetryWaitMax: p.Wait,
		Backoff:      func(min, _ time.Duration, _ int, _ *http.Response) time.Duration { return min },
		CheckRetry:   c.check,
		ErrorHandler: giveUp,
		PrepareRetry: func(*http.Request) error {
			if c.s.Rejected() {
				return ErrLeaseRejected
			}
			return nil
		},
	}
	return &wire.Client{
		BaseURL: c.s.cfg.BaseURL,
		HTTP:    &http.Client{Transport: &retryablehttp.RoundTripper{Client: rc}},
	}
}

// giveUp hands the last answer to wire.Client when the tries ran out on a
// status (so it becomes a *wire.StatusError), and only the error otherwise.
func giveUp(resp *http.Response, err error, _ int) (*http.Response, error) {
	if err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, err
	}
	return resp, nil
}

// fence is the transport under every try: after a lease rejection nothing
// more leaves the process.
type fence struct {
	s    *Session
	base http.RoundTripper
}

func (f fence) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.s.Rejected() {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, ErrLeaseRejected
	}
	return f.base.RoundTrip(r)
}
