// Package retry is the project's one way to try a call again. A Policy is
// a value written where the call is made — which classes of answers it
// tries again (wire.Classify decides the class), how many tries, how long
// each may take and how long it waits between them — and Policy.Do runs a
// call under it. A reader of the call sees which rule governs it (R24's
// receipts, K1's terminal reports).
//
// Anything of the module but wire may import retry; it imports only wire.
// It starts no goroutine and keeps no state between calls.
package retry

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Policy is one retry policy. Zero Tries means no limit but the caller's
// context: the caller then bounds the call (a lease fence, a deadline).
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

// Do calls try, each time with a context bounded by TryTimeout, until it
// succeeds, fails with a class the policy does not retry, the tries run
// out, try returns Final(err), or ctx ends (also while it waits). When ctx has a deadline, Do does
// not start a pause that would outlast it. It returns nil or the last
// try's error, as try returned it. observe, when not nil, sees every
// failed try before the pause that follows it.
func (p Policy) Do(ctx context.Context, try func(context.Context) error, observe func(Failure)) error {
	for n := 1; ; n++ {
		err := p.once(ctx, try)
		if err == nil {
			return nil
		}
		var fe finalError
		final := errors.As(err, &fe)
		if final {
			err = fe.err
		}
		f := Failure{Try: n, Err: err, Class: wire.Classify(err)}
		last := final || ctx.Err() != nil || !p.Retries(f.Class) || (p.Tries > 0 && n >= p.Tries)
		if !last {
			f.Next = max(p.Pause(n), retryAfter(err))
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= f.Next {
				last, f.Next = true, 0
			}
		}
		if observe != nil {
			observe(f)
		}
		if last || !sleep(ctx, f.Next) {
			return err
		}
	}
}

// Pause is the policy's pause after the n-th failure in a row (n >= 1):
// Wait, doubling with each further failure up to MaxWait. Do pauses so;
// a loop that runs on its own (a claim poll, the launch gate) uses it too.
func (p Policy) Pause(n int) time.Duration {
	d := p.Wait
	for i := 1; i < n && d < p.MaxWait; i++ {
		d = min(d*2, p.MaxWait)
	}
	return d
}

func (p Policy) once(ctx context.Context, try func(context.Context) error) error {
	if p.TryTimeout <= 0 {
		return try(ctx)
	}
	tctx, cancel := context.WithTimeout(ctx, p.TryTimeout)
	defer cancel()
	return try(tctx)
}

func retryAfter(err error) time.Duration {
	var se *wire.StatusError
	if errors.As(err, &se) {
		return se.RetryAfter
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Final marks a try's error as the end of the call whatever its class —
// for an answer the caller itself judges final, such as a fenced lease.
// Do returns the error inside.
func Final(err error) error { return finalError{err} }

type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }
func (e finalError) Unwrap() error { return e.err }
