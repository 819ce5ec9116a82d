package settlement

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// Defaults of the receipt policy (R24), also the first try timeout and
// pause of the report policy (K1).
const (
	DefaultTries      = 3
	DefaultWait       = 5 * time.Second
	DefaultTryTimeout = 10 * time.Second
	// DefaultReportMaxWait caps the doubling pause between tries of a
	// terminal report (K1).
	DefaultReportMaxWait = time.Minute
)

// ReceiptPolicy is the policy of the container record, the admission and
// the settlement (R24): up to three tries, 10 s each, 5 s apart; only
// transport failures and 408/502/503/504 (wire.Transient) are retried: a
// 500 or a 429 may follow a commit, and a receipt that may have committed
// is not asked for again blindly. p's non-zero fields are kept (tests
// scale the times down).
func ReceiptPolicy(p retry.Policy) retry.Policy {
	p.Name = "receipt"
	p.Retry = []wire.RetryClass{wire.Transient}
	if p.Tries <= 0 {
		p.Tries = DefaultTries
	}
	if p.Wait <= 0 {
		p.Wait = DefaultWait
	}
	p.MaxWait = p.Wait
	if p.TryTimeout <= 0 {
		p.TryTimeout = DefaultTryTimeout
	}
	return p
}

// ReportPolicy is the policy of the terminal reports — finish, abandon,
// release — and the shared_workspace_settled notice (K1): every answer that
// is not a verdict is tried again — transport failures, 408, 429, every
// 5xx — without a bound on the tries, 10 s each, the pause starting at 5 s
// and doubling to a minute, longer when the answer's Retry-After asks.
// Only 409/410 (the lease) and 401/403/404 (the credential) are verdicts;
// a 400 ends the call too (it is our bug: no retry changes it), and the
// caller keeps the report. What bounds the tries is the caller: the lease
// fence (the renewer's verdict, R8, R10, R11) or a deadline. p's non-zero
// times are kept.
func ReportPolicy(p retry.Policy) retry.Policy {
	p.Name = "report"
	p.Retry = []wire.RetryClass{wire.Transient, wire.ServerFault}
	p.Tries = 0
	if p.Wait <= 0 {
		p.Wait = DefaultWait
	}
	if p.MaxWait <= 0 {
		p.MaxWait = DefaultReportMaxWait
	}
	if p.TryTimeout <= 0 {
		p.TryTimeout = DefaultTryTimeout
	}
	return p
}

// uploadPolicy is the event uploader's: one try per call; it retries on
// its own cadence (events.go).
func uploadPolicy(p retry.Policy) retry.Policy {
	p = ReceiptPolicy(p)
	p.Name, p.Tries = "events", 1
	return p
}

// fence is the transport under every write of an attempt: after a lease
// rejection nothing more leaves the process, and the call ends at once
// (retry.Final) whatever its policy. It counts the tries of one write.
type fence struct {
	r     *Reporter
	base  http.RoundTripper
	tries *int
}

func (f fence) RoundTrip(req *http.Request) (*http.Response, error) {
	*f.tries++
	if f.r.Rejected() {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, retry.Final(ErrLeaseRejected)
	}
	return f.base.RoundTrip(req)
}

// write is one attempt-scoped write about to run under a policy.
type write struct {
	op     string
	policy retry.Policy
	// every records each failed try; otherwise the first one and each
	// change of class or status (a long K1 outage is one record per
	// change, and a retry record per pause).
	every bool
	quiet bool // record nothing (the event uploader records outages itself)
	// unsure is set when a try ended without a definitive answer: the
	// request may have been applied.
	unsure bool
	tries  int
}

// do runs fn with a wire client whose every request goes through the fence
// under w's policy: a retryablehttp client (w.policy.HTTP) makes the tries,
// and its observer records them. A lease rejection (the owner's LeaseLost,
// or an answer that rejects the lease) ends it at once and fences the
// attempt; the error then wraps ErrLeaseRejected.
func (r *Reporter) do(ctx context.Context, w *write, fn func(context.Context, *wire.Client) error) error {
	if r.Rejected() {
		return fmt.Errorf("%s: %w", w.op, ErrLeaseRejected)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(r.fenced, func() { cancel(ErrLeaseRejected) })()
	var prev *wire.StatusError
	observe := func(f retry.Failure) {
		if unsure(f.Err) {
			w.unsure = true
		}
		var se *wire.StatusError
		errors.As(f.Err, &se)
		changed := f.Try == 1 || (se == nil) != (prev == nil) || (se != nil && prev != nil && se.Status != prev.Status)
		prev = se
		if !w.quiet && (w.every || changed) {
			r.rec.ControlFailure(context.Background(), w.op, r.attempt(), f.Err)
		}
		if !w.quiet && !w.every && f.Next > 0 {
			r.recordRetry(w.op, f)
		}
	}
	wc := &wire.Client{BaseURL: r.cfg.BaseURL, HTTP: w.policy.HTTP(fence{r: r, base: r.cfg.Transport, tries: &w.tries}, observe)}
	err := fn(ctx, wc)
	if RejectsLease(err) {
		r.reject(ErrLeaseRejected)
	}
	if err != nil && r.Rejected() && !errors.Is(err, ErrLeaseRejected) {
		return fmt.Errorf("%w: %w", ErrLeaseRejected, err)
	}
	return err
}

// unsure: the try ended without a definitive answer, so the request may
// have been applied: a transport failure after the connection existed, a
// timeout, or a 5xx or 408 (which may follow a commit).
func unsure(err error) bool {
	if errors.Is(err, ErrLeaseRejected) {
		return false // never sent
	}
	var se *wire.StatusError
	if errors.As(err, &se) {
		return se.Status >= 500 || se.Status == http.StatusRequestTimeout
	}
	return !isDial(err)
}

// isDial reports a transport failure before the connection existed: the
// request certainly never reached the server.
func isDial(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
