// Package retry names the project's retry policies and configures the two
// libraries that carry them out. A Policy is a value written where the
// call is made — which classes of answers it tries again (wire.Classify
// decides the class), how many tries, how long each may take and how long
// it waits between them — so that a reader of the call sees which rule
// governs it (R24's receipts, K1's terminal reports). Policy.Client turns it
// into a github.com/hashicorp/go-retryablehttp client, which runs the
// tries of one HTTP call; Policy.Backoff into a
// github.com/cenkalti/backoff/v4 ExponentialBackOff, the pause schedule of
// a loop that runs on its own (the launch gate, the claim poll). This
// package has no loop of its own.
//
// Anything of the module but wire may import retry; it imports only wire
// and the two libraries. It starts no goroutine and keeps no state.
package retry

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/runnerd/runnerd/wire"
)

// Policy is one retry policy. Zero Tries means no limit but the caller's
// context: the caller then bounds the call (a lease fence, the local
// lease's validity as a deadline).
type Policy struct {
	// Name labels the policy in records ("receipt", "report").
	Name string
	// Retry lists the classes of failure that are tried again; every
	// other class ends the call with its error.
	Retry []wire.RetryClass
	// Tries bounds the tries, the first included; 0 means no bound.
	Tries int
	// TryTimeout bounds each try.
	TryTimeout time.Duration
	// Wait is the pause after the first failed try; each further pause
	// doubles, up to MaxWait (MaxWait <= Wait: a constant pause). An
	// answer's Retry-After that asks for longer is respected.
	Wait    time.Duration
	MaxWait time.Duration
	// Jitter spreads each pause of Backoff by ±Jitter (0.2: ±20 %), so
	// that a fleet does not retry in lockstep. Client does not use it:
	// receipts and reports keep their exact pauses.
	Jitter float64
}

// Failure is one failed try, handed to the caller's observer.
type Failure struct {
	Try   int // 1 for the first try
	Err   error
	Class wire.RetryClass
	// Next is the pause before the next try; 0 when no try follows.
	Next time.Duration
}

// Retries reports whether the policy tries an error of this class again.
func (p Policy) Retries(c wire.RetryClass) bool { return slices.Contains(p.Retry, c) }

// HTTP is the *http.Client a wire.Client takes to make one call under p:
// its transport is retryablehttp's RoundTripper over Client(base,
// observe), which buffers the request's body and sends it again on each
// try. Build one per call: the client counts the call's tries.
func (p Policy) HTTP(base http.RoundTripper, observe func(Failure)) *http.Client {
	return &http.Client{Transport: &retryablehttp.RoundTripper{Client: p.Client(base, observe)}}
}

// Client is a retryablehttp.Client that runs the tries of one call under
// p over base (nil: http.DefaultTransport):
//
//   - each try is bounded by TryTimeout (the inner http.Client's Timeout);
//   - CheckRetry classifies each failed try with wire.Classify and tries
//     again only a class p retries, while tries are left, the try's error is
//     not Final, and the call's context is alive; when that context has a
//     deadline (the local lease's validity), a pause that would outlast it
//     is not started;
//   - Backoff is p's pause — Wait, doubling to MaxWait — or the answer's
//     Retry-After when that asks for longer;
//   - ErrorHandler hands the last try's answer or error back as it came, so
//     the wire client turns it into its typed error; no URL is added.
//
// RequestLogHook notes each try's number, which the library does not hand
// CheckRetry. observe, when not nil, sees every failed try with the pause
// that follows it (0 when none does), before that pause; CheckRetry calls
// it, the one hook that sees transport failures and status answers alike
// and knows the decision (ResponseLogHook misses transport failures, the
// ErrorHandler a definitive answer). The library's logger is off: the
// records are the caller's, made in observe from a class and a status
// (R15–R18).
func (p Policy) Client(base http.RoundTripper, observe func(Failure)) *retryablehttp.Client {
	if base == nil {
		base = http.DefaultTransport
	}
	retryMax := p.Tries - 1
	if p.Tries <= 0 {
		retryMax = int(^uint32(0) >> 1) // no bound but the context
	}
	try := 0 // the try in flight, as the library numbers it (RequestLogHook)
	return &retryablehttp.Client{
		HTTPClient:     &http.Client{Transport: roundTripOnly{base}, Timeout: p.TryTimeout},
		RetryMax:       retryMax,
		RetryWaitMin:   p.Wait,
		RetryWaitMax:   max(p.Wait, p.MaxWait),
		RequestLogHook: func(_ retryablehttp.Logger, _ *http.Request, attempt int) { try = attempt + 1 },
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			if err == nil && resp.StatusCode >= 200 && resp.StatusCode <= 299 {
				return false, nil
			}
			f := Failure{Try: try, Err: failure(resp, err)}
			f.Class = wire.Classify(f.Err)
			var fe finalError
			again := !errors.As(err, &fe) && ctx.Err() == nil && p.Retries(f.Class) && (p.Tries <= 0 || try < p.Tries)
			if again {
				f.Next = p.pause(try-1, resp)
				if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= f.Next {
					again, f.Next = false, 0
				}
			}
			if observe != nil {
				observe(f)
			}
			return again, nil
		},
		Backoff: func(_, _ time.Duration, attempt int, resp *http.Response) time.Duration {
			return p.pause(attempt, resp)
		},
		ErrorHandler: func(resp *http.Response, err error, _ int) (*http.Response, error) {
			if err == nil {
				return resp, nil // a status answer: the wire client reads it
			}
			if resp != nil {
				resp.Body.Close()
			}
			return nil, bare(err)
		},
	}
}

// roundTripOnly hides a shared transport's CloseIdleConnections, which
// retryablehttp calls when a call gives up: one call's end must not drop
// the pooled connections of every other.
type roundTripOnly struct{ base http.RoundTripper }

func (r roundTripOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.base.RoundTrip(req)
}

// pause is the pause after try attempt+1 failed with resp (nil for a
// transport failure): retryablehttp's exponential schedule from Wait to
// MaxWait, or the answer's Retry-After when that is longer.
func (p Policy) pause(attempt int, resp *http.Response) time.Duration {
	d := retryablehttp.DefaultBackoff(p.Wait, max(p.Wait, p.MaxWait), attempt, nil)
	if resp != nil {
		d = max(d, wire.RetryAfter(resp.Header.Get("Retry-After"), time.Now()))
	}
	return d
}

// failure is a failed try as the wire client would report it: a status
// answer as a *wire.StatusError (status and Retry-After; the body stays
// unread for the caller), a transport failure as its error without the
// URL.
func failure(resp *http.Response, err error) error {
	if err != nil {
		return bare(err)
	}
	return &wire.StatusError{Status: resp.StatusCode, RetryAfter: wire.RetryAfter(resp.Header.Get("Retry-After"), time.Now())}
}

// bare drops the *url.Error around a transport failure (it names the URL)
// and the Final mark.
func bare(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var fe finalError
	if errors.As(err, &fe) {
		err = fe.err
	}
	return err
}

// Backoff is the pause schedule of a loop that runs on its own — the
// launch gate (R37), the claim poll, the backend probe, the cancel poll:
// Wait, doubling with each NextBackOff up to MaxWait, each pause spread by
// ±Jitter; it never stops (no elapsed-time limit) and Reset starts it over
// at Wait. Not safe for concurrent use.
func (p Policy) Backoff() *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.Wait),
		backoff.WithMaxInterval(max(p.Wait, p.MaxWait)),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(p.Jitter),
		backoff.WithMaxElapsedTime(0),
	)
}

// Final marks a try's error as the end of the call whatever its class —
// for a failure the caller itself judges final, such as a fenced lease
// (the error a transport under Client returns). The call returns the
// error inside.
func Final(err error) error { return finalError{err} }

type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }
func (e finalError) Unwrap() error { return e.err }
