package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrLeaseRejected: the lease was rejected (409 lease_lost, 401, 403,
	// 404, 410, or the owner's LeaseLost). Nothing more is written about the
	// attempt (R8, R10, R11, R22, R23).
	ErrLeaseRejected = errors.New("lease rejected: nothing more is written for this attempt")
	// ErrAmbiguousAdmission: no admission answer arrived and the request
	// may have committed. The turn fails, the prompt is never sent, and the
	// terminal report carries Ambiguous so the conversation becomes LOST (R30).
	ErrAmbiguousAdmission = errors.New("admission unacknowledged: it may have committed")
	// ErrNoAdmission: a prompt or a settlement without an admission receipt
	// from this Session's Admit.
	ErrNoAdmission = errors.New("no admission receipt")
	// ErrPromptSent: the prompt of this admission was already handed over (R25).
	ErrPromptSent = errors.New("prompt already sent")
	// ErrPromptNotSent: settlement before the prompt was handed over.
	ErrPromptNotSent = errors.New("prompt not sent")
	// ErrUnconfirmed: the supervisor could not confirm the turn's
	// completion for this activation (for example it restarted and lost its
	// receipt). Settlement fails closed (R28).
	ErrUnconfirmed = errors.New("supervisor settlement unconfirmed")
	// ErrNotSettled: a notice before a recorded settlement.
	ErrNotSettled = errors.New("not settled")
	// ErrEventsDropped: Close found events of the attempt that never reached
	// the control plane (refused while the buffer was full, or still queued
	// when the uploader stopped). They were recorded as dropped (R21).
	ErrEventsDropped = errors.New("events dropped")
)

// Classes of terminal failures decided here.
const (
	ClassAdmissionAmbiguous = "admission_ambiguous"
	ClassUnsettled          = "unsettled"
	ClassLeaseRejected      = "lease_rejected"
)

// Config configures a Session. Zero fields mean the default.
type Config struct {
	// BaseURL is the control plane's address. Required.
	BaseURL string
	// Transport carries every request; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// WorkerToken is this attempt's token. Required; never logged.
	WorkerToken string
	// JobID and Attempt name the attempt and its fencing token. Required.
	JobID   string
	Attempt wire.AttemptRef
	// Prompt is the turn's prompt, handed over only by SendPrompt.
	Prompt string
	// Logger receives the records; nil means slog.Default().
	Logger *slog.Logger
	// Receipts is the policy of the container record, the admission and
	// the settlement (ReceiptPolicy fills its zero fields, R24); its
	// TryTimeout and Wait also pace the event upload.
	Receipts retry.Policy
	// Reports is the policy of the notice and the terminal report
	// (ReportPolicy fills its zero fields, K1).
	Reports retry.Policy
	// LeaseTTL bounds the notice's tries (K1: while the lease can be
	// valid; the notice is information, R23, and must not hold the turn
	// open). Default 120 s.
	LeaseTTL time.Duration
	// Events bounds the event buffer and upload.
	Events EventsConfig
}

// Facts are what the Session learned about the attempt; they decide the
// terminal report (Facts.Report). A daemon that sends the report on the
// turn child's behalf gets them in the child's result.
type Facts struct {
	ContainerRecorded bool `json:"container_recorded"`
	Admitted          bool `json:"admitted"`
	Ambiguous         bool `json:"admission_ambiguous"`
	PromptSent        bool `json:"prompt_sent"`
	Settled           bool `json:"settled"`
}

// Session is the control-plane side of one attempt. Its methods are safe
// for concurrent use; LeaseLost may come from the renewal goroutine.
type Session struct {
	cfg Config
	rec diagnostics.Recorder
	rep *Reporter // the fence, and the terminal report

	admitMu  sync.Mutex // one Admit at a time
	settleMu sync.Mutex // one Settle at a time

	mu        sync.Mutex // guards the fields below
	facts     Facts
	admitDone bool
	adm       *Admission
	admErr    error
	boundary  *wire.Boundary
	noticed   bool

	ev *uploader
}

// New returns a Session for one attempt and starts its event uploader;
// Close stops it and waits.
func New(cfg Config) (*Session, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rcfg := ReporterConfig{
		BaseURL: cfg.BaseURL, Transport: cfg.Transport, WorkerToken: cfg.WorkerToken,
		JobID: cfg.JobID, Attempt: cfg.Attempt, Logger: cfg.Logger, Reports: cfg.Reports,
	}
	if !rcfg.complete() {
		return nil, errIncomplete
	}
	rep := NewReporter(rcfg)
	cfg.Receipts = ReceiptPolicy(cfg.Receipts)
	cfg.Reports = rep.cfg.Reports
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	cfg.Events = cfg.Events.withDefaults()
	s := &Session{cfg: cfg, rec: diagnostics.NewRecorder(cfg.Logger), rep: rep}
	s.ev = startUploader(s)
	return s, nil
}

// DefaultLeaseTTL is Config.LeaseTTL's default (R1).
const DefaultLeaseTTL = 120 * time.Second

// Reporter is the Session's Reporter: its fence, and its terminal report.
func (s *Session) Reporter() *Reporter { return s.rep }

// Close stops the event uploader and waits for it. It writes nothing. Its
// error says how many of the attempt's events never reached the control
// plane (ErrEventsDropped).
func (s *Session) Close() error {
	if n := s.ev.stop(); n > 0 {
		return fmt.Errorf("%w: %d never reached the control plane", ErrEventsDropped, n)
	}
	return nil
}

// LeaseLost is the owner's signal that the lease is gone (a renewal
// answered 409/401/403/404, or the last acknowledgement is a whole lease
// old). From now on nothing is written about the attempt, and requests in
// flight are cancelled.
func (s *Session) LeaseLost() { s.rep.LeaseLost() }

// Rejected reports whether the lease was rejected.
func (s *Session) Rejected() bool { return s.rep.Rejected() }

// Fence is done once the lease is rejected — by LeaseLost or by an answer
// to one of the Session's own writes — so the owner can stop the agent at
// once (K5).
func (s *Session) Fence() context.Context { return s.rep.Fence() }

// Facts returns what the Session has learned so far.
func (s *Session) Facts() Facts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.facts
}

// RecordContainer records the retained sandbox's identity with the control
// plane. Only a recorded identity lets a failure before admission abandon
// the activation and keep the conversation usable (R29).
func (s *Session) RecordContainer(ctx context.Context, backend, containerID string) error {
	return s.recordContainer(ctx, wire.ContainerRequest{AttemptRef: s.cfg.Attempt, Backend: backend, ContainerID: containerID})
}

// ResumeContainer is RecordContainer for the turn of a quarantined
// conversation (K13), once the turn verified the retained container and
// the supervisor's native turn boundary: the control plane records that
// boundary with the container and the conversation is usable again.
func (s *Session) ResumeContainer(ctx context.Context, backend, containerID string, nativeTurn int64) error {
	return s.recordContainer(ctx, wire.ContainerRequest{AttemptRef: s.cfg.Attempt, Backend: backend, ContainerID: containerID,
		Resumed: &wire.ResumedBoundary{NativeTurn: nativeTurn}})
}

func (s *Session) recordContainer(ctx context.Context, req wire.ContainerRequest) error {
	err := s.rep.do(ctx, &write{op: wire.OpContainer, policy: s.cfg.Receipts, every: true}, func(ctx context.Context, wc *wire.Client) error {
		return wc.Container(ctx, s.cfg.WorkerToken, s.cfg.JobID, req)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.facts.ContainerRecorded = true
	s.mu.Unlock()
	return nil
}

// Admission is the control plane's acknowledged admission of this
// attempt's job. Only Session.Admit makes a usable one; it is the only key
// to SendPrompt.
type Admission struct {
	s       *Session
	receipt wire.AdmissionReceipt
}

// Receipt returns the control plane's receipt.
func (a *Admission) Receipt() wire.AdmissionReceipt { return a.receipt }

// Admit asks the control plane to admit the job for this activation, under
// the policy. A Session admits once: calling Admit again returns the first
// call's result, and never asks again — in particular not after an
// ambiguous admission (R30). Errors: ErrAmbiguousAdmission when no answer
// arrived and the request may have committed; otherwise the definitive
// refusal (a *wire.StatusError).
func (s *Session) Admit(ctx context.Context, activationID string) (*Admission, error) {
	s.admitMu.Lock()
	defer s.admitMu.Unlock()
	s.mu.Lock()
	if s.admitDone {
		defer s.mu.Unlock()
		return s.adm, s.admErr
	}
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("admit job %s: %w", s.cfg.JobID, err) // nothing was sent: not ambiguous
	}

	w := &write{op: wire.OpAdmission, policy: s.cfg.Receipts, every: true}
	var rcpt wire.AdmissionReceipt
	err := s.rep.do(ctx, w, func(ctx context.Context, wc *wire.Client) error {
		var err error
		rcpt, err = wc.Admission(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.AdmissionRequest{
			AttemptRef: s.cfg.Attempt, ActivationID: activationID,
		})
		return err
	})
	if err == nil && (rcpt.JobID != s.cfg.JobID || rcpt.ActivationID != activationID) {
		// A receipt for something else proves nothing about this request.
		err, w.unsure = errors.New("admission: receipt for another job or activation"), true
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.admitDone = true
	switch {
	case err == nil:
		s.facts.Admitted = true
		s.adm = &Admission{s: s, receipt: rcpt}
	case w.unsure:
		s.facts.Ambiguous = true
		s.admErr = fmt.Errorf("admit job %s after %d tries: %w", s.cfg.JobID, w.tries, ErrAmbiguousAdmission)
	default:
		s.admErr = fmt.Errorf("admit job %s: %w", s.cfg.JobID, err)
	}
	return s.adm, s.admErr
}

// SendPrompt hands the Session's prompt to the agent through run — the
// sandbox's "run the turn with this prompt" — and returns what run returns.
// It is the only way this package hands a prompt over, it needs the
// receipt of a received admission, and it works once per Session (hence
// once per receipt, and a copy of the receipt does not help): a second
// call, a call without a receipt from Admit or after a lease rejection
// returns an error and never calls run (R25, R30). A failed run is not
// retried: the prompt may have reached the agent.
func SendPrompt[T any](ctx context.Context, a *Admission, run func(ctx context.Context, prompt string) (T, error)) (T, error) {
	var zero T
	if a == nil || a.s == nil {
		return zero, ErrNoAdmission
	}
	s := a.s
	if s.Rejected() {
		return zero, fmt.Errorf("send prompt: %w", ErrLeaseRejected)
	}
	s.mu.Lock()
	if s.facts.PromptSent {
		s.mu.Unlock()
		return zero, ErrPromptSent
	}
	s.facts.PromptSent = true
	prompt := s.cfg.Prompt
	s.mu.Unlock()
	return run(ctx, prompt)
}

// Settle confirms the turn's completion: first the supervisor's receipt
// for this activation (supervisor, which must answer with the admitted
// activation), then the control-plane settlement with that receipt, which
// returns the recorded boundary (R26, R27). A settled Session answers
// again with the same boundary without asking; after a failure Settle may
// be called again and both sides answer with what they recorded. A
// supervisor that cannot confirm fails closed with ErrUnconfirmed (R28).
func (s *Session) Settle(ctx context.Context, a *Admission, supervisor func(context.Context) (wire.SupervisorReceipt, error)) (wire.Boundary, error) {
	if a == nil || a.s != s {
		return wire.Boundary{}, ErrNoAdmission
	}
	s.settleMu.Lock()
	defer s.settleMu.Unlock()
	s.mu.Lock()
	b, sent := s.boundary, s.facts.PromptSent
	s.mu.Unlock()
	if b != nil {
		return *b, nil
	}
	if !sent {
		return wire.Boundary{}, ErrPromptNotSent
	}
	if s.Rejected() {
		return wire.Boundary{}, fmt.Errorf("settle: %w", ErrLeaseRejected)
	}
	act := a.receipt.ActivationID
	rcpt, err := supervisor(ctx)
	if err != nil {
		return wire.Boundary{}, fmt.Errorf("settle activation %s: %w: %w", act, ErrUnconfirmed, err)
	}
	if rcpt.ActivationID != act || rcpt.ReceiptID == "" {
		return wire.Boundary{}, fmt.Errorf("settle activation %s: receipt for another activation: %w", act, ErrUnconfirmed)
	}

	var got wire.Boundary
	err = s.rep.do(ctx, &write{op: wire.OpSettlement, policy: s.cfg.Receipts, every: true}, func(ctx context.Context, wc *wire.Client) error {
		var err error
		got, err = wc.Settlement(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.SettlementRequest{
			AttemptRef: s.cfg.Attempt, ActivationID: act, Supervisor: rcpt,
		})
		return err
	})
	if err != nil {
		return wire.Boundary{}, fmt.Errorf("settle job %s: %w", s.cfg.JobID, err)
	}
	s.mu.Lock()
	s.boundary = &got
	s.facts.Settled = true
	s.mu.Unlock()
	return got, nil
}

// Notify sends the shared_workspace_settled notice for the recorded
// boundary under the report policy (K1), for at most Config.LeaseTTL. Its
// failure is recorded (agent_control_failure) and returned for
// information only: the turn still succeeds (R23). Before settlement or
// after a lease rejection it writes nothing.
func (s *Session) Notify(ctx context.Context) error {
	s.mu.Lock()
	b, done := s.boundary, s.noticed
	s.mu.Unlock()
	if b == nil {
		return ErrNotSettled
	}
	if done {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseTTL)
	defer cancel()
	err := s.rep.do(ctx, &write{op: wire.OpNotices, policy: s.cfg.Reports}, func(ctx context.Context, wc *wire.Client) error {
		return wc.Notice(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.NoticeRequest{
			AttemptRef: s.cfg.Attempt, Kind: wire.NoticeSharedWorkspaceSettled, Boundary: *b,
		})
	})
	if err != nil {
		return fmt.Errorf("notice for job %s: %w", s.cfg.JobID, err)
	}
	s.mu.Lock()
	s.noticed = true
	s.mu.Unlock()
	return nil
}

// Result is how the turn ended, as its handler saw it.
type Result struct {
	Outcome string // wire.Outcome*; "" means failed
	Class   string // error class of a failure
	Reason  string // operator detail; no secrets
	// Cause and CauseEvidence say why a turn that did not succeed ended
	// (S5); carried on a finish, not on an abandon.
	Cause         wire.Cause
	CauseEvidence string
}

// Report decides the terminal report of an attempt from what is known:
//   - success needs a recorded settlement; without one it is a failure (R28);
//   - a failure before admission with a recorded container abandons, so the
//     conversation stays usable (R29);
//   - an ambiguous admission is reported as such (R30): the control plane
//     marks the conversation LOST rather than requeue.
func (f Facts) Report(ref wire.AttemptRef, r Result) Report {
	outcome, class := r.Outcome, r.Class
	if outcome == "" {
		outcome = wire.OutcomeFailed
	}
	if outcome == wire.OutcomeSucceeded && !f.Settled {
		outcome, class = wire.OutcomeFailed, ClassUnsettled
	}
	if f.Ambiguous && class == "" {
		class = ClassAdmissionAmbiguous
	}
	if outcome == wire.OutcomeFailed && f.ContainerRecorded && !f.Admitted && !f.Ambiguous {
		return Report{Abandon: &wire.AbandonRequest{AttemptRef: ref, Class: class, Reason: r.Reason}}
	}
	fin := &wire.FinishRequest{AttemptRef: ref, Outcome: outcome, Class: class, Reason: r.Reason, Ambiguous: f.Ambiguous}
	if outcome != wire.OutcomeSucceeded {
		fin.Cause, fin.CauseEvidence = r.Cause, r.CauseEvidence
	}
	return Report{Finish: fin}
}

// Finish sends the attempt's terminal report (Facts.Report) through the
// Session's Reporter under the report policy (K1), after giving pending
// events a bounded chance (EventsConfig.Flush); event upload never gates it
// (R21). It runs even if ctx is already cancelled (a terminal report is
// owed) until it is acknowledged or refused, but not after a lease
// rejection, which also ends it. Finishing twice returns the first answer.
func (s *Session) Finish(ctx context.Context, r Result) (wire.FinishResponse, error) {
	rep := s.Facts().Report(s.cfg.Attempt, r)
	if class, failed := rep.Failed(); failed {
		s.rec.TurnFailed(context.Background(), s.attempt(), diagnostics.StageTurn, class)
	}
	if s.Rejected() {
		return wire.FinishResponse{}, fmt.Errorf("finish: %w", ErrLeaseRejected)
	}
	ctx = context.WithoutCancel(ctx)
	s.ev.flush(ctx)
	return s.rep.Send(ctx, rep)
}
