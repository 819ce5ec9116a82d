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
	// OnRenewed, if set, is called with the new lease after every
	// acknowledged renewal, on the goroutine that made it: one call at a
	// time, in order, the next renewal waiting for it (the daemon sends it
	// to the turn child as a DEADLINE frame, K5). It must not block for
	// long; it may call Lease or Stop.
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

// Renewer renews one attempt's lease until its verdict. It keeps no
// goroutine of its own: between renewals it is a timer (time.AfterFunc), and
// each renewal's request and answer run on that timer's short-lived
// goroutine, which arms the timer again and ends. A parked goroutine per
// held turn would cost its stack for the turn's whole life.
//
// The renewer is not a retry policy and does not run under go-retryablehttp
// or cenkalti/backoff as the receipts, reports and launch gate do: R14's
// cadence is exact and has two clocks — the next renewal one interval after
// the last acknowledged one was sent, a retry one RetryDelay after a failure
// ended, each try bounded by its request timeout and the lease by the last
// acknowledgement — and a generic retrier knows neither the send time of the
// acknowledged try nor when to give the lease up; its timer state machine
// is that schedule, written once.
type Renewer struct {
	cfg     Config
	a       Attempt
	req     wire.RenewRequest
	rec     diagnostics.Recorder
	id      diagnostics.Attempt
	ctx     context.Context // canceled by Stop; the parent of every request's
	stop    context.CancelFunc
	done    chan struct{}
	cancelC chan struct{}

	// mu guards everything below: the phase and the timer, the lease, the
	// counts the records carry and the verdict. It is never held while a
	// request is in flight or OnRenewed runs.
	mu          sync.Mutex
	phase       phase
	timer       *time.Timer // calls fire at the next renewal; armed only while waiting
	lastAckSent boottime.Instant
	ttl         time.Duration
	renewals    int   // acknowledged
	failures    int   // consecutive, since the last acknowledgement
	lastErr     error // of the last failure
	cancelSeen  bool  // cancelC is closed or about to be
	verdict     Verdict
}

// phase is where a Renewer is: waiting and renewing in turn, until ended.
type phase int

const (
	// waiting: the timer is armed for the next renewal (or the deadline);
	// no goroutine of the renewer exists. Stop ends it at once.
	waiting phase = iota
	// renewing: a request is in flight on the timer's goroutine, which
	// handles its answer; Stop cancels the request and that goroutine
	// decides Stopped.
	renewing
	// ended: the verdict is decided and Done closed.
	ended
)

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
		cfg: cfg,
		a:   a,
		req: wire.RenewRequest{
			AttemptRef: wire.AttemptRef{AttemptID: a.AttemptID, LeaseGeneration: a.LeaseGeneration},
			LeaseTTLMS: cfg.LeaseTTL.Milliseconds(),
		},
		rec:         diagnostics.NewRecorder(cfg.Logger),
		id:          diagnostics.Attempt{JobID: a.JobID, AttemptID: a.AttemptID},
		ctx:         ctx,
		stop:        stop,
		done:        make(chan struct{}),
		cancelC:     make(chan struct{}),
		lastAckSent: claimSent,
		ttl:         capTTL(a.LeaseTTL, cfg.LeaseTTL, cfg.LeaseTTL),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = time.AfterFunc(r.untilNext(claimSent.Add(r.every(r.ttl))), r.fire)
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
// Between renewals the verdict is decided before Stop returns; during a
// renewal, once its canceled request returns.
func (r *Renewer) Stop() {
	r.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.phase == waiting {
		// A fire already started finds the phase ended and returns.
		r.timer.Stop()
		r.stopped()
	}
}

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
	return Lease{Sent: r.lastAckSent, Deadline: r.deadline()}
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

// deadline is when the lease is no longer valid locally. r.mu is held.
func (r *Renewer) deadline() boottime.Instant { return r.lastAckSent.Add(r.ttl) }

// untilNext is how long from now the timer waits for a renewal due at next:
// never past the deadline, where fire gives the lease up. r.mu is held.
func (r *Renewer) untilNext(next boottime.Instant) time.Duration {
	return earlier(next, r.deadline()).Sub(r.cfg.Clock.Now())
}

// wait goes back to waiting for a renewal due at next, unless Stop came
// meanwhile. r.mu is held.
func (r *Renewer) wait(next boottime.Instant) {
	if r.ctx.Err() != nil {
		r.stopped()
		return
	}
	r.phase = waiting
	r.timer.Reset(r.untilNext(next))
}

// end decides the verdict. r.mu is held.
func (r *Renewer) end(v Verdict) {
	v.Renewals, v.LastAckSent = r.renewals, r.lastAckSent
	r.verdict, r.phase = v, ended
	close(r.done)
}

// stopped ends with Stopped. r.mu is held.
func (r *Renewer) stopped() {
	r.rec.HeartbeatStopped(context.Background(), r.id, r.renewals)
	r.end(Verdict{Outcome: Stopped})
}

// fire is the timer's callback, on a goroutine of its own that lives for one
// renewal: it gives the lease up at the deadline, or sends the renewal and
// handles its answer. An HTTP round trip grows a stack to 8–16 KB; a
// goroutine that ends after it keeps none of that.
func (r *Renewer) fire() {
	r.mu.Lock()
	if r.phase != waiting { // Stop came first
		r.mu.Unlock()
		return
	}
	if r.ctx.Err() != nil { // Stop is waiting for r.mu
		r.stopped()
		r.mu.Unlock()
		return
	}
	sent, deadline := r.cfg.Clock.Now(), r.deadline()
	if !sent.Before(deadline) {
		r.rec.LeaseExpired(context.Background(), r.id, r.failures, sent.Sub(r.lastAckSent), r.lastErr)
		r.end(Verdict{Outcome: Expired})
		r.mu.Unlock()
		return
	}
	r.phase = renewing
	r.mu.Unlock()

	// The request may not outlive the lease: an answer after the deadline
	// would come too late to count.
	ctx, cancel := context.WithTimeout(r.ctx, earlier(sent.Add(r.cfg.RequestTimeout), deadline).Sub(sent))
	resp, err := r.cfg.Client.Renew(ctx, r.a.WorkerToken, r.a.JobID, r.req)
	cancel()
	if err == nil {
		r.acknowledged(sent, resp)
	} else {
		r.failed(err)
	}
}

// acknowledged takes the answer to the renewal sent at sent.
func (r *Renewer) acknowledged(sent boottime.Instant, resp wire.RenewResponse) {
	r.mu.Lock()
	if r.failures > 0 {
		r.rec.HeartbeatRecovered(context.Background(), r.id, r.failures, r.cfg.Clock.Now().Sub(r.lastAckSent))
	}
	r.lastAckSent, r.ttl = sent, capTTL(time.Duration(resp.LeaseTTLMS)*time.Millisecond, r.cfg.LeaseTTL, r.ttl)
	r.renewals, r.failures, r.lastErr = r.renewals+1, 0, nil
	lease := Lease{Sent: r.lastAckSent, Deadline: r.deadline()}
	cancelNow := resp.CancelRequested && !r.cancelSeen
	r.cancelSeen = r.cancelSeen || cancelNow
	r.mu.Unlock()

	// Still renewing: no other goroutine calls OnRenewed or closes cancelC.
	if r.cfg.OnRenewed != nil {
		r.cfg.OnRenewed(lease)
	}
	if cancelNow {
		close(r.cancelC)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.wait(sent.Add(r.every(r.ttl)))
}

// failed takes a renewal's failure.
func (r *Renewer) failed(err error) {
	bg := context.Background()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		r.stopped()
		return
	}
	// wire classifies statuses for everyone (409/410 definitive,
	// 401/403/404 a refused credential).
	switch status := diagnostics.Status(err); wire.ClassifyStatus(status) {
	case wire.Definitive:
		r.rec.LeaseLost(bg, r.id, status)
		r.end(Verdict{Outcome: Lost, Status: status})
		return
	case wire.CredentialRefused:
		r.rec.CredentialRefused(bg, r.id, status)
		r.end(Verdict{Outcome: CredentialRefused, Status: status})
		return
	}
	// Anything else may pass: retry while the lease can still be valid.
	r.failures++
	r.lastErr = err
	if r.failures == 1 {
		r.rec.ControlFailure(bg, wire.OpRenew, r.id, err)
	}
	if r.failures >= r.cfg.IdleResetAfter && r.cfg.Client.HTTP != nil {
		r.cfg.Client.HTTP.CloseIdleConnections()
	}
	now := r.cfg.Clock.Now()
	next := now.Add(r.cfg.RetryDelay)
	if next.Before(r.deadline()) {
		r.rec.HeartbeatRetry(bg, r.id, r.failures, now.Sub(r.lastAckSent), r.cfg.RetryDelay)
	}
	r.wait(next)
}

func earlier(a, b boottime.Instant) boottime.Instant {
	if a.Before(b) {
		return a
	}
	return b
}
