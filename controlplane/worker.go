package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// The other long polls (a host's cancels, a follow of a job's events) ask
// the store again after pollMin, doubling up to pollMax; the claim's waits
// for the store's signal (waitForWork).
const (
	pollMin = 20 * time.Millisecond
	pollMax = 250 * time.Millisecond
)

// poll calls try until it reports true or an error, or until wait has
// passed or ctx is done (which is not an error: the answer is "nothing").
// It waits on timers only, so a synctest bubble's fake clock drives it.
func poll(ctx context.Context, wait time.Duration, try func(context.Context) (bool, error)) (bool, error) {
	deadline := time.Now().Add(wait)
	delay := pollMin
	for {
		if ok, err := try(ctx); ok || err != nil {
			return ok, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		t := time.NewTimer(min(delay, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
		delay = min(2*delay, pollMax)
	}
}

// leaseTTL turns a requested lease (0 = default) into a duration within
// the configured bounds.
func (s *Server) leaseTTL(ms int64) (time.Duration, *apiError) {
	if ms == 0 {
		return s.cfg.LeaseTTL, nil
	}
	// Bounded in milliseconds first: a huge ms would overflow the
	// multiplication into a lease within the bounds.
	if ms < 0 || ms > s.cfg.MaxLeaseTTL.Milliseconds() || time.Duration(ms)*time.Millisecond < s.cfg.MinLeaseTTL {
		return 0, invalid("lease_ttl_ms must be 0 (the default, %d) or between %d and %d.",
			s.cfg.LeaseTTL.Milliseconds(), s.cfg.MinLeaseTTL.Milliseconds(), s.cfg.MaxLeaseTTL.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// longPoll is how long to hold a request that asked for ms milliseconds.
func (s *Server) longPoll(ms int64) time.Duration {
	return time.Duration(min(max(ms, 0), s.cfg.ClaimWaitMax.Milliseconds())) * time.Millisecond
}

func (s *Server) handleClaim(w http.ResponseWriter, r *http.Request) {
	const op = "claim"
	// The hold is measured from here, after the host sent the request, to
	// the store's grant: the host's send plus it is never later than the
	// lease's start (K4).
	arrived := time.Now()
	h, ok := s.host(w, r, op)
	if !ok {
		return
	}
	var req wire.ClaimRequest
	if e := decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case req.WaitMS < 0:
		writeError(w, invalid("wait_ms must not be negative."))
		return
	case req.MaxClaims < 0 || req.MaxClaims > wire.MaxClaimsPerRequest:
		writeError(w, invalid("max_claims must be between 0 and %d.", wire.MaxClaimsPerRequest))
		return
	}
	ttl, e := s.leaseTTL(req.LeaseTTLMS)
	if e != nil {
		writeError(w, e)
		return
	}
	if !validClaimKey(req.IdempotencyKey) {
		writeError(w, invalid("idempotency_key must be empty or %d to %d characters of A-Z, a-z, 0-9, - and _.",
			wire.MinIdempotencyKey, wire.MaxIdempotencyKey))
		return
	}
	if !s.useInstance(w, r, op, h, false) {
		return
	}
	wait := s.longPoll(req.WaitMS)

	// The tokens are handed out in this answer; the store keeps their
	// hashes. A keyed claim's tokens derive from the key, so that a replay
	// can hand the same ones out again without any store keeping them.
	slots := make([]store.ClaimSlot, max(req.MaxClaims, 1))
	tokens := make([]string, len(slots)) // the i-th claim's, unless replayed
	for i := range slots {
		tokens[i] = NewToken(WorkerTokenPrefix)
		if key := req.IdempotencyKey; key != "" {
			slots[i].AttemptID = newAttemptID()
			tokens[i] = WorkerTokenFor(key, slots[i].AttemptID)
		}
		slots[i].WorkerTokenHash = HashToken(tokens[i])
	}
	p := store.ClaimParams{HostID: h.ID, LeaseTTL: ttl, PinnedOnly: req.PinnedOnly,
		AttemptID: slots[0].AttemptID, WorkerTokenHash: slots[0].WorkerTokenHash, More: slots[1:]}
	if key := req.IdempotencyKey; key != "" {
		p.KeyHash = HashToken(key)
	}
	// The identity of the database that grants the claims (K8): the host
	// records it with a sandbox it creates for one. Read before claiming,
	// so a failure here leaves nothing claimed.
	cluster, err := s.cfg.Store.ClusterID(r.Context())
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	var claims []wire.Claim
	found, err := s.waitForWork(r.Context(), wait, func(ctx context.Context) (bool, error) {
		p.Held = time.Since(arrived)
		var err error
		if p.Now, err = s.cfg.Store.Now(ctx); err != nil {
			return false, err
		}
		claims, err = s.cfg.Store.ClaimMany(ctx, p)
		return len(claims) > 0, err
	})
	if errors.Is(err, store.ErrKeyTaken) {
		// The retry of a claim whose attempts' leases are over: what it
		// claimed is the reaper's now, and waiting cannot free the key.
		// Nothing to claim, at once; the host's next claim has a new key.
		s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgClaimKeyTaken, slog.String("host", h.Name))
		found, err = false, nil
	}
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	if !found {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	for i := range claims {
		c := &claims[i]
		c.WorkerToken = tokens[i]
		c.ClusterID = cluster
		if c.Replayed {
			// The first answer's attempt: its token, its hold (the store
			// kept it, rounded down like this one: a hair early, never late).
			c.WorkerToken = WorkerTokenFor(req.IdempotencyKey, c.AttemptID)
		}
		if c.LeaseTTLMS == 0 {
			c.LeaseTTLMS = ttl.Milliseconds()
		}
		s.log.LogAttrs(r.Context(), slog.LevelInfo, MsgAttemptClaimed,
			slog.String("job_id", c.JobID), slog.String("attempt_id", c.AttemptID),
			slog.String("host", h.Name), slog.Int64("lease_generation", c.LeaseGeneration),
			slog.Time("lease_expires_at", c.LeaseExpiresAt), slog.Bool("replayed", c.Replayed))
	}
	s.cfg.Metrics.claimedTurns.Add(float64(len(claims)))
	if req.MaxClaims <= 1 {
		writeJSON(w, http.StatusOK, claims[0]) // the one claim's shape, as every control plane answers
		return
	}
	writeJSON(w, http.StatusOK, wire.ClaimBatch{Claims: claims})
}

// waitForWork is the claim's long poll: it calls try until it reports
// true or an error, or until wait has passed or ctx is done (which is not
// an error: the answer is "nothing"). It tries again when the store
// signals that work may have come (Store.WorkSignal: NOTIFY on PostgreSQL
// from any replica, an in-process signal on SQLite), never on a timer of
// its own but the slow ClaimRecheck, for what no signal announces (a
// release backoff ending, a listener reconnecting).
func (s *Server) waitForWork(ctx context.Context, wait time.Duration, try func(context.Context) (bool, error)) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		var wake <-chan struct{}
		if wait > 0 {
			wake = s.cfg.Store.WorkSignal() // before the try, so that no signal falls between
		}
		if ok, err := try(ctx); ok || err != nil {
			return ok, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		t := time.NewTimer(min(s.cfg.ClaimRecheck, left))
		s.cfg.Metrics.claimPolls.Inc()
		select {
		case <-ctx.Done():
		case <-wake:
			s.cfg.Metrics.claimWakes.WithLabelValues("signal").Inc()
		case <-t.C:
			s.cfg.Metrics.claimWakes.WithLabelValues("recheck").Inc()
		}
		s.cfg.Metrics.claimPolls.Dec()
		t.Stop()
		if ctx.Err() != nil {
			return false, nil
		}
	}
}

// validClaimKey: empty, or wire's bounds of base32/base64url characters.
func validClaimKey(k string) bool {
	if k == "" {
		return true
	}
	if len(k) < wire.MinIdempotencyKey || len(k) > wire.MaxIdempotencyKey {
		return false
	}
	for _, r := range k {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// validPressure checks a heartbeat's sandbox_pressure (S2).
func validPressure(p wire.SandboxPressure) bool {
	return (p.Resource == wire.PressureDisk || p.Resource == wire.PressureMemory) &&
		p.FreeBytes >= 0 && p.TotalBytes >= 0 && p.MinFreeBytes >= 0 && !p.Since.IsZero()
}

func (s *Server) handleHostHeartbeat(w http.ResponseWriter, r *http.Request) {
	const op = "host_heartbeat"
	h, ok := s.host(w, r, op)
	if !ok {
		return
	}
	var req wire.HostHeartbeat
	if e := decode(w, r, &req, "capacity", "running", "draining"); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case req.Capacity < 0 || req.Running < 0:
		writeError(w, invalid("capacity and running must not be negative."))
		return
	case req.LaunchError != nil && (req.LaunchError.Class == "" || req.LaunchError.Consecutive < 1 || req.LaunchError.Since.IsZero()):
		writeError(w, invalid("launch_error needs a class, a consecutive count of at least 1 and the time since when."))
		return
	case req.SandboxPressure != nil && !validPressure(*req.SandboxPressure):
		writeError(w, invalid("sandbox_pressure needs resource disk or memory, byte counts that are not negative and the time since when."))
		return
	case req.IntervalMS < 0 || len(req.ClaimsWithheld) > 64:
		writeError(w, invalid("interval_ms must not be negative and claims_withheld is a class of at most 64 bytes."))
		return
	}
	if !s.useInstance(w, r, op, h, true) {
		return
	}
	now, ok := s.now(w, r, op)
	if !ok {
		return
	}
	if err := s.cfg.Store.RecordHostHeartbeat(r.Context(), h.ID, req, now); err != nil {
		s.fail(w, r, op, err)
		return
	}
	cluster, err := s.cfg.Store.ClusterID(r.Context())
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	resp := wire.HostHeartbeatResponse{ServerTime: now, ClusterID: cluster}
	if h.Previous != nil {
		// A rotation's grace: the host still holds its previous token.
		// Its new one derives from it; adopted again on every such
		// heartbeat, so an answer the host never got is given again.
		prev := bearer(r)
		next := RotatedToken(prev, h.Previous.Nonce)
		if err := s.cfg.Store.AdoptRotatedToken(r.Context(), h.ID, HashToken(prev), HashToken(next)); err != nil {
			s.fail(w, r, op, err)
			return
		}
		resp.HostToken = next
	}
	writeJSON(w, http.StatusOK, resp)
}

// maxInstanceHeader bounds the instance headers' values.
const maxInstanceHeader = 64

// useInstance checks the daemon instance a host heartbeat (beat) or claim
// names in its headers (wire.HeaderInstanceID): another live instance of
// the host is answered 409 host_token_in_use. A request naming none (a
// daemon that predates the headers) is not checked.
func (s *Server) useInstance(w http.ResponseWriter, r *http.Request, op string, h store.Host, beat bool) bool {
	in := store.Instance{ID: r.Header.Get(wire.HeaderInstanceID), BootID: r.Header.Get(wire.HeaderBootID),
		Stopping: beat && r.Header.Get(wire.HeaderInstanceStopping) == "1"}
	if in.ID == "" {
		return true
	}
	if len(in.ID) > maxInstanceHeader || len(in.BootID) > maxInstanceHeader {
		writeError(w, invalid("%s and %s are at most %d bytes.", wire.HeaderInstanceID, wire.HeaderBootID, maxInstanceHeader))
		return false
	}
	now, ok := s.now(w, r, op)
	if !ok {
		return false
	}
	err := s.cfg.Store.UseHostInstance(r.Context(), h.ID, in, beat, now)
	if errors.Is(err, store.ErrHostTokenInUse) {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, MsgHostTokenInUse, slog.String("host", h.Name), slog.String("op", op))
		writeError(w, refuse(http.StatusConflict, wire.CodeHostTokenInUse,
			"Another daemon, still live, uses this host token; give each daemon its own (register it, or controlplane host add)."))
		return false
	}
	if err != nil {
		s.fail(w, r, op, err)
		return false
	}
	return true
}

// handleCancels is the host's long poll for the user's cancels of its
// running attempts (K10): held like a claim until one of the attempts it
// names has its cancel requested, 204 if none has within the wait.
func (s *Server) handleCancels(w http.ResponseWriter, r *http.Request) {
	const op = "cancels"
	h, ok := s.host(w, r, op)
	if !ok {
		return
	}
	var req wire.CancelsRequest
	if e := decode(w, r, &req, "attempt_ids"); e != nil {
		writeError(w, e)
		return
	}
	switch {
	case len(req.AttemptIDs) == 0 || len(req.AttemptIDs) > wire.MaxCancelWatch:
		writeError(w, invalid("attempt_ids must hold 1 to %d ids.", wire.MaxCancelWatch))
		return
	case req.WaitMS < 0:
		writeError(w, invalid("wait_ms must not be negative."))
		return
	}
	for _, id := range req.AttemptIDs {
		if id == "" {
			writeError(w, invalid("attempt_ids must not hold an empty id."))
			return
		}
	}
	var ids []string
	found, err := poll(r.Context(), s.longPoll(req.WaitMS), func(ctx context.Context) (bool, error) {
		var err error
		ids, err = s.cfg.Store.CancelsRequested(ctx, h.ID, req.AttemptIDs)
		return len(ids) > 0, err
	})
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	if !found {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, wire.CancelsResponse{AttemptIDs: ids})
}

// attemptCall is the shape of every attempt-scoped call: the worker token
// authorizes one attempt of the path's job, the body names that same
// attempt and its lease generation, check validates the body's other
// fields, and do makes the one guarded store write.
func attemptCall[Req any](s *Server, op string, ref func(*Req) wire.AttemptRef,
	check func(*Req) *apiError, do func(ctx context.Context, req *Req, now time.Time) (any, error),
) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth, ok := s.attempt(w, r, op)
		if !ok {
			return
		}
		var req Req
		if !decodeCall(w, r, &req, ref, check) {
			return
		}
		if ref(&req).AttemptID != auth.AttemptID {
			writeError(w, errOtherAttempt)
			return
		}
		now, ok := s.now(w, r, op)
		if !ok {
			return
		}
		out, err := do(r.Context(), &req, now)
		if err != nil {
			s.fail(w, r, op, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// workerCall is attemptCall for a call whose store method authorizes the
// worker itself, in its guarded statement with the clock read inside it:
// one round trip to PostgreSQL. A body that is not well formed is refused
// before the token is looked at.
func workerCall[Req any](s *Server, op string, ref func(*Req) wire.AttemptRef,
	check func(*Req) *apiError, do func(ctx context.Context, wk store.Worker, req *Req) (any, error),
) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok := bearer(r)
		if tok == "" {
			writeError(w, errNoToken)
			return
		}
		var req Req
		if !decodeCall(w, r, &req, ref, check) {
			return
		}
		out, err := do(r.Context(), store.Worker{JobID: r.PathValue("job"), TokenHash: HashToken(tok)}, &req)
		if err != nil {
			s.fail(w, r, op, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// decodeCall decodes an attempt-scoped call's body and checks it, or
// answers 400 and reports false.
func decodeCall[Req any](w http.ResponseWriter, r *http.Request, req *Req, ref func(*Req) wire.AttemptRef, check func(*Req) *apiError) bool {
	if e := decode(w, r, req); e != nil {
		writeError(w, e)
		return false
	}
	a := ref(req)
	switch {
	case a.AttemptID == "":
		writeError(w, invalid("attempt_id is required."))
		return false
	case a.LeaseGeneration < 1:
		writeError(w, invalid("lease_generation must be at least 1."))
		return false
	}
	if check != nil {
		if e := check(req); e != nil {
			writeError(w, e)
			return false
		}
	}
	return true
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request) {
	var ttl time.Duration
	workerCall(s, wire.OpRenew,
		func(q *wire.RenewRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.RenewRequest) (e *apiError) {
			ttl, e = s.leaseTTL(q.LeaseTTLMS)
			return e
		},
		func(ctx context.Context, wk store.Worker, q *wire.RenewRequest) (any, error) {
			resp, err := s.cfg.Store.RenewAs(ctx, wk, q.AttemptRef, ttl, time.Time{})
			if resp.LeaseTTLMS == 0 {
				resp.LeaseTTLMS = ttl.Milliseconds()
			}
			return resp, err
		})(w, r)
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	workerCall(s, wire.OpEvents,
		func(q *wire.EventsRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.EventsRequest) *apiError {
			for _, ev := range q.Events {
				if ev.Seq < 1 || ev.Type == "" {
					return invalid("every event needs a seq of at least 1 and a type.")
				}
			}
			return nil
		},
		func(ctx context.Context, wk store.Worker, q *wire.EventsRequest) (any, error) {
			return s.cfg.Store.AppendEventsAs(ctx, wk, q.AttemptRef, q.Events, time.Time{})
		})(w, r)
}

func (s *Server) handleContainer(w http.ResponseWriter, r *http.Request) {
	attemptCall(s, wire.OpContainer,
		func(q *wire.ContainerRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.ContainerRequest) *apiError {
			if q.Backend != "process" && q.Backend != "docker" {
				return invalid(`backend must be "process" or "docker".`)
			}
			if q.ContainerID == "" {
				return invalid("container_id is required.")
			}
			return nil
		},
		func(ctx context.Context, q *wire.ContainerRequest, now time.Time) (any, error) {
			return wire.Empty{}, s.cfg.Store.RecordContainer(ctx, q.AttemptRef, *q, now)
		})(w, r)
}

func (s *Server) handleAdmission(w http.ResponseWriter, r *http.Request) {
	workerCall(s, wire.OpAdmission,
		func(q *wire.AdmissionRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.AdmissionRequest) *apiError {
			if q.ActivationID == "" {
				return invalid("activation_id is required.")
			}
			return nil
		},
		func(ctx context.Context, wk store.Worker, q *wire.AdmissionRequest) (any, error) {
			return s.cfg.Store.AdmitAs(ctx, wk, q.AttemptRef, q.ActivationID, time.Time{})
		})(w, r)
}

func (s *Server) handleSettlement(w http.ResponseWriter, r *http.Request) {
	workerCall(s, wire.OpSettlement,
		func(q *wire.SettlementRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.SettlementRequest) *apiError {
			switch {
			case q.ActivationID == "":
				return invalid("activation_id is required.")
			case q.Supervisor.ActivationID != q.ActivationID:
				return invalid("supervisor_receipt.activation_id must be the settled activation_id.")
			case q.Supervisor.ReceiptID == "":
				return invalid("supervisor_receipt.receipt_id is required.")
			case q.Supervisor.NativeTurn < 0:
				return invalid("supervisor_receipt.native_turn must not be negative.")
			}
			return nil
		},
		func(ctx context.Context, wk store.Worker, q *wire.SettlementRequest) (any, error) {
			return s.cfg.Store.SettleAs(ctx, wk, q.AttemptRef, *q, time.Time{})
		})(w, r)
}

func (s *Server) handleNotice(w http.ResponseWriter, r *http.Request) {
	attemptCall(s, wire.OpNotices,
		func(q *wire.NoticeRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.NoticeRequest) *apiError {
			if q.Kind != wire.NoticeSharedWorkspaceSettled {
				return invalid("kind must be %q.", wire.NoticeSharedWorkspaceSettled)
			}
			return nil
		},
		func(ctx context.Context, q *wire.NoticeRequest, now time.Time) (any, error) {
			return wire.Empty{}, s.cfg.Store.Notice(ctx, q.AttemptRef, *q, now)
		})(w, r)
}

func (s *Server) handleAbandon(w http.ResponseWriter, r *http.Request) {
	attemptCall(s, wire.OpAbandon,
		func(q *wire.AbandonRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.AbandonRequest) *apiError {
			if q.Class == "" {
				return invalid("class is required.")
			}
			return nil
		},
		func(ctx context.Context, q *wire.AbandonRequest, now time.Time) (any, error) {
			return s.cfg.Store.Abandon(ctx, q.AttemptRef, *q, now)
		})(w, r)
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	attemptCall(s, wire.OpRelease,
		func(q *wire.ReleaseRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.ReleaseRequest) *apiError {
			switch {
			case q.Class == "spawn_failed", q.Class == "payload_undelivered",
				strings.HasPrefix(q.Class, "declined:") && len(q.Class) > len("declined:"):
				return nil
			}
			return invalid(`class must be "spawn_failed", "payload_undelivered" or "declined:<class>".`)
		},
		func(ctx context.Context, q *wire.ReleaseRequest, now time.Time) (any, error) {
			return wire.Empty{}, s.cfg.Store.Release(ctx, q.AttemptRef, *q, now)
		})(w, r)
}

func (s *Server) handleFinish(w http.ResponseWriter, r *http.Request) {
	workerCall(s, wire.OpFinish,
		func(q *wire.FinishRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.FinishRequest) *apiError {
			switch q.Outcome {
			case wire.OutcomeSucceeded, wire.OutcomeFailed, wire.OutcomeCancelled, wire.OutcomeWorkerLost:
				return nil
			}
			return invalid(`outcome must be "succeeded", "failed", "cancelled" or "worker_lost".`)
		},
		func(ctx context.Context, wk store.Worker, q *wire.FinishRequest) (any, error) {
			return s.cfg.Store.FinishAs(ctx, wk, q.AttemptRef, *q, time.Time{})
		})(w, r)
}

// handlePermissionAnswer is the turn child's long poll for the owner's
// answer to one of its permission requests: 200 with the option once the
// owner's answer is recorded, 204 when none came within the wait.
func (s *Server) handlePermissionAnswer(w http.ResponseWriter, r *http.Request) {
	const op = wire.OpPermissions
	auth, ok := s.attempt(w, r, op)
	if !ok {
		return
	}
	var req wire.PermissionsRequest
	if !decodeCall(w, r, &req, func(q *wire.PermissionsRequest) wire.AttemptRef { return q.AttemptRef },
		func(q *wire.PermissionsRequest) *apiError {
			switch {
			case q.RequestID == "":
				return invalid("request_id is required.")
			case q.WaitMS < 0:
				return invalid("wait_ms must not be negative.")
			}
			return nil
		}) {
		return
	}
	if req.AttemptID != auth.AttemptID {
		writeError(w, errOtherAttempt)
		return
	}
	var option string
	found, err := poll(r.Context(), s.longPoll(req.WaitMS), func(ctx context.Context) (bool, error) {
		var err error
		option, err = s.cfg.Store.PermissionAnswer(ctx, r.PathValue("job"), req.AttemptID, req.RequestID)
		return option != "", err
	})
	if err != nil {
		s.fail(w, r, op, err)
		return
	}
	if !found {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, wire.PermissionsResponse{OptionID: option})
}
