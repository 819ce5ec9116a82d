package heartbeat

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/wire"
)

// Config configures a Renewer. Zero fields mean the default.
type Config struct {
	Timings
	// Client is the thin protocol client whose HTTP is NewHTTPClient's
	// client; required.
	Client *wire.Client
	// Logger receives the records of diagnostics; nil discards them.
	Logger *slog.Logger
	// IdleResetAfter is how many consecutive failures close the client's
	// idle connections. Default 2.
	IdleResetAfter int
	// Clock is what the lease is counted on (R10). Default
	// boottime.System, CLOCK_BOOTTIME: the clock the turn child and the
	// supervisor fence themselves with, which keeps counting while the
	// machine is suspended. A testing/synctest bubble passes
	// boottime.Since(time.Now()) to count on its fake time.
	Clock boottime.Clock
	// OnRenewed, if set, is called on the renewer's goroutine with the new
	// lease after every acknowledged renewal (the daemon sends it to the
	// turn child as a DEADLINE frame, K5). It must not block for long.
	OnRenewed func(Lease)
}

// Lease is the local view of the lease: the send time of the last
// acknowledged renewal (or of the claim) and the deadline it gives, both on
// the Config's Clock.
type Lease struct {
	Sent     boottime.Instant
	Deadline boottime.Instant
}

// Attempt is what the renewer needs to know of the claimed attempt.
type Attempt struct {
	JobID           string
	AttemptID       string
	LeaseGeneration int64
	WorkerToken     string        // never logged
	LeaseTTL        time.Duration // granted by the control plane; 0 = the configured lease
	// ClaimSent is when the claim request was sent (R10: the claim is the
	// first acknowledgement, and the server set the expiry no earlier). Use a
	// time.Now() value: the time elapsed since it is carried over to the
	// Clock on the monotonic clock. Zero means now.
	ClaimSent time.Time
}

// AttemptFromClaim takes the attempt out of a claim answer; sent is when the
// claim request was sent.
func AttemptFromClaim(c wire.Claim, sent time.Time) Attempt {
	return Attempt{
		JobID:           c.JobID,
		AttemptID:       c.AttemptID,
		LeaseGeneration: c.LeaseGeneration,
		WorkerToken:     c.WorkerToken,
		LeaseTTL:        time.Duration(c.LeaseTTLMS) * time.Millisecond,
		ClaimSent:       sent,
	}
}

// Outcome is how a Renewer ended.
type Outcome int

const (
	Stopped           Outcome = iota + 1 // the owner called Stop
	Lost                                 // 409 or 410 on renewal (R8)
	CredentialRefused                    // 401, 403 or 404 on renewal (R11)
	Expired                              // the last acknowledgement is a whole lease old (R10)
)

func (o Outcome) String() string {
	switch o {
	case Stopped:
		return "stopped"
	case Lost:
		return "lost"
	case CredentialRefused:
		return "credential_refused"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Sentinel errors of the verdicts that end a turn.
var (
	ErrLeaseLost         = errors.New("lease lost")
	ErrCredentialRefused = errors.New("worker credential refused")
	ErrLeaseExpired      = errors.New("lease expired locally")
)

// Verdict is the renewer's single answer to its owner.
type Verdict struct {
	Outcome     Outcome
	Status      int              // the HTTP status for Lost and CredentialRefused
	Renewals    int              // acknowledged renewals
	LastAckSent boottime.Instant // send time of the last acknowledged renewal, or the claim's, on the Clock
}

// Err is nil for Stopped and the matching sentinel otherwise: the turn
// must stop and write nothing more about the attempt.
func (v Verdict) Err() error {
	switch v.Outcome {
	case Lost:
		return ErrLeaseLost
	case CredentialRefused:
		return ErrCredentialRefused
	case Expired:
		return ErrLeaseExpired
	}
	return nil
}

// Renewer renews one attempt's lease on its own goroutine until its verdict.
type Renewer struct {
	cfg     Config
	a       Attempt
	rec     diagnostics.Recorder
	id      diagnostics.Attempt
	ctx     context.Context // canceled by Stop
	stop    context.CancelFunc
	done    chan struct{}
	cancelC chan struct{}

	claimSent boottime.Instant // a.ClaimSent on the Clock

	mu          sync.Mutex // guards the three fields below
	lastAckSent boottime.Instant
	ttl         time.Duration
	verdict     Verdict
}

// Start starts renewing a's lease. The first renewal goes one interval after
// the claim was sent. The caller owns the renewer: it must call Stop when the
// turn is over and wait for Done.
func Start(cfg Config, a Attempt) *Renewer {
	cfg.Timings = cfg.Timings.withDefaults()
	if cfg.IdleResetAfter <= 0 {
		cfg.IdleResetAfter = 2
	}
	if cfg.Clock == nil {
		cfg.Clock = boottime.System{}
	}
	if a.ClaimSent.IsZero() {
		a.ClaimSent = time.Now()
	}
	claimSent := boottime.FromTime(cfg.Clock, a.ClaimSent)
	ctx, stop := context.WithCancel(context.Background())
	r := &Renewer{
		cfg:         cfg,
		a:           a,
		rec:         diagnostics.NewRecorder(cfg.Logger),
		id:          diagnostics.Attempt{JobID: a.JobID, AttemptID: a.AttemptID},
		ctx:         ctx,
		stop:        stop,
		done:        make(chan struct{}),
		cancelC:     make(chan struct{}),
		claimSent:   claimSent,
		lastAckSent: claimSent,
		ttl:         capTTL(a.LeaseTTL, cfg.LeaseTTL, cfg.LeaseTTL),
	}
	go r.run()
	return r
}

// capTTL is the lease to count with: the granted one capped by ours, or the
// previous one when the control plane did not say.
func capTTL(granted, configured, previous time.Duration) time.Duration {
	if granted <= 0 {
		return previous
	}
	return min(granted, configured)
}

// Stop ends renewal; the verdict is then Stopped unless another came first.
// It does not wait: the owner waits on Done. Stop may be called many times.
func (r *Renewer) Stop() { r.stop() }

// Done is closed once the verdict is decided.
func (r *Renewer) Done() <-chan struct{} { return r.done }

// Verdict waits for Done and returns the verdict.
func (r *Renewer) Verdict() Verdict {
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.verdict
}

// CancelRequested is closed once when a renewal answer carried the user's
// cancel request (P7). Renewal goes on (R13): the owner drains the turn and
// calls Stop.
func (r *Renewer) CancelRequested() <-chan struct{} { return r.cancelC }

// Lease is the lease as it stands: the last acknowledged renewal's send
// time and the deadline, that time plus the lease, after which the lease is
// no longer valid locally. Writes about the attempt must not start after it.
func (r *Renewer) Lease() Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Lease{Sent: r.lastAckSent, Deadline: r.lastAckSent.Add(r.ttl)}
}

// every is the interval between an acknowledgement and the next renewal. A
// granted lease too short for the configured interval plus a request gets
// three tries per lease instead.
func (r *Renewer) every(ttl time.Duration) time.Duration {
	if r.cfg.Interval+r.cfg.RequestTimeout > ttl {
		return ttl / 3
	}
	return r.cfg.Interval
}

func (r *Renewer) run() {
	defer close(r.done)
	v := r.loop()
	r.mu.Lock()
	v.LastAckSent = r.lastAckSent
	r.verdict = v
	r.mu.Unlock()
}

// renew sends one renewal and waits for its answer, exactly as a call
// would; only the request runs on a goroutine of its own. An HTTP round trip
// grows a stack to 8–16 KB, and the runtime halves a parked goroutine's
// stack at most once a collection, so the loop's goroutine, parked 30 s
// between renewals on every held turn, would keep most of that growth: it
// stays at its small starting stack instead (issue 12 §6).
func (r *Renewer) renew(ctx context.Context, req wire.RenewRequest) (wire.RenewResponse, error) {
	type answer struct {
		resp wire.RenewResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := r.cfg.Client.Renew(ctx, r.a.WorkerToken, r.a.JobID, req)
		answered <- answer{resp, err}
	}()
	a := <-answered
	return a.resp, a.err
}

func (r *Renewer) loop() Verdict {
	var (
		bg        = context.Background()
		clock     = r.cfg.Clock
		lastAck   = r.claimSent
		ttl       = r.ttl
		next      = lastAck.Add(r.every(ttl))
		renewals  int
		failures  int
		lastErr   error
		cancelled bool
		timer     = time.NewTimer(time.Hour)
	)
	defer timer.Stop()
	req := wire.RenewRequest{
		AttemptRef: wire.AttemptRef{AttemptID: r.a.AttemptID, LeaseGeneration: r.a.LeaseGeneration},
		LeaseTTLMS: r.cfg.LeaseTTL.Milliseconds(),
	}
	for {
		deadline := lastAck.Add(ttl)
		timer.Reset(earlier(next, deadline).Sub(clock.Now()))
		select {
		case <-r.ctx.Done():
			r.rec.HeartbeatStopped(bg, r.id, renewals)
			return Verdict{Outcome: Stopped, Renewals: renewals}
		case <-timer.C:
		}
		sent := clock.Now()
		if !sent.Before(deadline) {
			r.rec.LeaseExpired(bg, r.id, failures, sent.Sub(lastAck), lastErr)
			return Verdict{Outcome: Expired, Renewals: renewals}
		}
		// The request may not outlive the lease: an answer after the
		// deadline would come too late to count.
		ctx, cancel := context.WithTimeout(r.ctx, earlier(sent.Add(r.cfg.RequestTimeout), deadline).Sub(sent))
		resp, err := r.renew(ctx, req)
		cancel()
		if err == nil {
			if failures > 0 {
				r.rec.HeartbeatRecovered(bg, r.id, failures, clock.Now().Sub(lastAck))
			}
			lastAck, ttl = sent, capTTL(time.Duration(resp.LeaseTTLMS)*time.Millisecond, r.cfg.LeaseTTL, ttl)
			renewals, failures, lastErr = renewals+1, 0, nil
			r.mu.Lock()
			r.lastAckSent, r.ttl = lastAck, ttl
			r.mu.Unlock()
			if r.cfg.OnRenewed != nil {
				r.cfg.OnRenewed(Lease{Sent: lastAck, Deadline: lastAck.Add(ttl)})
			}
			if resp.CancelRequested && !cancelled {
				cancelled = true
				close(r.cancelC)
			}
			next = lastAck.Add(r.every(ttl))
			continue
		}
		if r.ctx.Err() != nil {
			r.rec.HeartbeatStopped(bg, r.id, renewals)
			return Verdict{Outcome: Stopped, Renewals: renewals}
		}
		// wire classifies statuses for everyone (409/410 definitive,
		// 401/403/404 a refused credential).
		switch status := diagnostics.Status(err); wire.ClassifyStatus(status) {
		case wire.Definitive:
			r.rec.LeaseLost(bg, r.id, status)
			return Verdict{Outcome: Lost, Status: status, Renewals: renewals}
		case wire.CredentialRefused:
			r.rec.CredentialRefused(bg, r.id, status)
			return Verdict{Outcome: CredentialRefused, Status: status, Renewals: renewals}
		}
		// Anything else may pass: retry while the lease can still be valid.
		failures++
		lastErr = err
		if failures == 1 {
			r.rec.ControlFailure(bg, wire.OpRenew, r.id, err)
		}
		if failures >= r.cfg.IdleResetAfter && r.cfg.Client.HTTP != nil {
			r.cfg.Client.HTTP.CloseIdleConnections()
		}
		now := clock.Now()
		next = now.Add(r.cfg.RetryDelay)
		if next.Before(deadline) {
			r.rec.HeartbeatRetry(bg, r.id, failures, now.Sub(lastAck), r.cfg.RetryDelay)
		}
	}
}

func earlier(a, b boottime.Instant) boottime.Instant {
	if a.Before(b) {
		return a
	}
	return b
}
