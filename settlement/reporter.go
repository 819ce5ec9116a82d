package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// ClassReleaseRefused is the class of the failed finish that replaces a
// release the control plane refused because the job was admitted (R36).
const ClassReleaseRefused = "release_refused"

// Report is the terminal report of an attempt: exactly one of Finish,
// Release and Abandon is set. It is what a turn child hands its daemon,
// what the daemon persists before sending it (P2), and what a Reporter
// sends.
type Report struct {
	Finish  *wire.FinishRequest  `json:"finish,omitempty"`
	Release *wire.ReleaseRequest `json:"release,omitempty"`
	Abandon *wire.AbandonRequest `json:"abandon,omitempty"`
}

// Op is the report's operation (wire.OpFinish, OpRelease or OpAbandon).
func (r Report) Op() string {
	switch {
	case r.Release != nil:
		return wire.OpRelease
	case r.Abandon != nil:
		return wire.OpAbandon
	}
	return wire.OpFinish
}

// Valid: exactly one of the three is set, and it is about ref.
func (r Report) Valid(ref wire.AttemptRef) bool {
	switch {
	case r.Finish != nil && r.Abandon == nil && r.Release == nil:
		return r.Finish.AttemptRef == ref && r.Finish.Outcome != ""
	case r.Abandon != nil && r.Finish == nil && r.Release == nil:
		return r.Abandon.AttemptRef == ref && r.Abandon.Class != ""
	case r.Release != nil && r.Finish == nil && r.Abandon == nil:
		return r.Release.AttemptRef == ref && r.Release.Class != ""
	}
	return false
}

// Failed returns the class of a report of a failed turn: an abandon (a
// failure before admission, R29) or a failed finish.
func (r Report) Failed() (class string, failed bool) {
	switch {
	case r.Abandon != nil:
		return r.Abandon.Class, true
	case r.Finish != nil && r.Finish.Outcome == wire.OutcomeFailed:
		return r.Finish.Class, true
	}
	return "", false
}

// ReporterConfig configures a Reporter. Zero fields mean the default.
type ReporterConfig struct {
	// BaseURL is the control plane's address. Required.
	BaseURL string
	// Transport carries every request; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// WorkerToken is this attempt's token. Required; never logged.
	WorkerToken string
	// JobID and Attempt name the attempt and its fencing token. Required.
	JobID   string
	Attempt wire.AttemptRef
	// Logger receives the records; nil means slog.Default().
	Logger *slog.Logger
	// Reports is the policy of Send (ReportPolicy fills its zero fields).
	Reports retry.Policy
}

// Reporter owns what is said last about one attempt: its terminal report —
// finish, abandon or release — under the report policy (K1), and the
// attempt's fence: after a lease rejection (an answer 409 lease_lost, 401,
// 403, 404 or 410, or the owner's LeaseLost) nothing more about the
// attempt leaves the process, from the Reporter or from the Session built
// on it. The daemon holds one per attempt; a turn child's Session has one.
// Safe for concurrent use.
type Reporter struct {
	cfg ReporterConfig
	rec diagnostics.Recorder

	fenced context.Context // done once the lease is rejected
	reject context.CancelCauseFunc

	sendMu sync.Mutex           // one Send at a time; guards sent
	sent   *wire.FinishResponse // the acknowledged answer
}

// errIncomplete: a Reporter without the attempt's address, token or ids
// cannot send anything.
var errIncomplete = errors.New("settlement: BaseURL, WorkerToken, JobID and Attempt.AttemptID are required")

func (c ReporterConfig) complete() bool {
	return c.BaseURL != "" && c.WorkerToken != "" && c.JobID != "" && c.Attempt.AttemptID != ""
}

// NewReporter returns the Reporter of one attempt. One whose config lacks
// the address, the token or the ids refuses every Send.
func NewReporter(cfg ReporterConfig) *Reporter {
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Reports = ReportPolicy(cfg.Reports)
	r := &Reporter{cfg: cfg, rec: diagnostics.NewRecorder(cfg.Logger)}
	r.fenced, r.reject = context.WithCancelCause(context.Background())
	return r
}

// LeaseLost is the owner's signal that the lease is gone (a renewal
// answered 409/401/403/404, or the last acknowledgement is a whole lease
// old). From now on nothing is written about the attempt, and requests in
// flight are cancelled.
func (r *Reporter) LeaseLost() { r.reject(ErrLeaseRejected) }

// Rejected reports whether the lease was rejected.
func (r *Reporter) Rejected() bool { return r.fenced.Err() != nil }

// Fence is done once the lease is rejected (K5: the turn child stops its
// agent on it).
func (r *Reporter) Fence() context.Context { return r.fenced }

// Send sends the terminal report under the report policy (K1) until it is
// acknowledged, refused, the lease is rejected or ctx ends. Sending again
// after an acknowledgement returns the first answer (P2 on our side).
//
// An abandon the control plane refuses because the job was admitted (409
// admitted) becomes an ambiguous failure: the admission committed although
// no receipt arrived (R30). A release it refuses for the same reason (R36:
// the child did accept after all) becomes a failed finish of class
// ClassReleaseRefused. An acknowledged release answers JobState queued.
//
// Errors: one wrapping ErrLeaseRejected when the lease is gone; ctx's end;
// otherwise the refusal, a *wire.StatusError no retry changes (a 400: our
// bug). In none of these cases was the report applied.
func (r *Reporter) Send(ctx context.Context, rep Report) (wire.FinishResponse, error) {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	if r.sent != nil {
		return *r.sent, nil
	}
	if !r.cfg.complete() {
		return wire.FinishResponse{}, errIncomplete
	}
	resp, err := r.send(ctx, rep)
	if err == nil {
		r.sent = &resp
	}
	return resp, err
}

func (r *Reporter) send(ctx context.Context, rep Report) (wire.FinishResponse, error) {
	token, job := r.cfg.WorkerToken, r.cfg.JobID
	var resp wire.FinishResponse
	if rep.Release != nil {
		err := r.do(ctx, &write{op: wire.OpRelease, policy: r.cfg.Reports}, func(ctx context.Context, wc *wire.Client) error {
			return wc.Release(ctx, token, job, *rep.Release)
		})
		if err == nil {
			return wire.FinishResponse{JobState: wire.JobQueued}, nil
		}
		if !isAdmitted(err) {
			return resp, fmt.Errorf("release job %s: %w", job, err)
		}
		rep = Report{Finish: &wire.FinishRequest{
			AttemptRef: rep.Release.AttemptRef, Outcome: wire.OutcomeFailed, Class: ClassReleaseRefused,
			Reason: "the control plane refused the release: the job was admitted",
		}}
	}
	if rep.Abandon != nil {
		err := r.do(ctx, &write{op: wire.OpAbandon, policy: r.cfg.Reports}, func(ctx context.Context, wc *wire.Client) error {
			var err error
			resp, err = wc.Abandon(ctx, token, job, *rep.Abandon)
			return err
		})
		if !isAdmitted(err) {
			if err != nil {
				err = fmt.Errorf("abandon job %s: %w", job, err)
			}
			return resp, err
		}
		rep = Report{Finish: &wire.FinishRequest{
			AttemptRef: rep.Abandon.AttemptRef, Outcome: wire.OutcomeFailed,
			Class: rep.Abandon.Class, Reason: rep.Abandon.Reason, Ambiguous: true,
		}}
	}
	if rep.Finish == nil {
		return resp, errors.New("settlement: empty report")
	}
	err := r.do(ctx, &write{op: wire.OpFinish, policy: r.cfg.Reports}, func(ctx context.Context, wc *wire.Client) error {
		var err error
		resp, err = wc.Finish(ctx, token, job, *rep.Finish)
		return err
	})
	if err != nil {
		return resp, fmt.Errorf("finish job %s: %w", job, err)
	}
	return resp, nil
}

func isAdmitted(err error) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Code == wire.CodeAdmitted
}

// RejectsLease reports whether an error from the wire client means the
// attempt's lease is gone: the credential refused (401/403/404), the job
// gone (410), or a 409 that is not one of the answers about admission or
// the conversation (admitted, not_admitted, conversation_lost).
func RejectsLease(err error) bool {
	var se *wire.StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch wire.Classify(err) {
	case wire.CredentialRefused:
		return true
	case wire.Definitive:
		switch se.Code {
		case wire.CodeAdmitted, wire.CodeNotAdmitted, wire.CodeConversationLost:
			return false
		}
		return true
	}
	return false
}

func (r *Reporter) attempt() diagnostics.Attempt {
	return diagnostics.Attempt{JobID: r.cfg.JobID, AttemptID: r.cfg.Attempt.AttemptID}
}
