package controlplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// attemptOps is every attempt-scoped call with a well-formed body for a claim.
var attemptOps = []struct {
	op   string
	body func(c wire.Claim) any
}{
	{wire.OpRenew, func(c wire.Claim) any { return wire.RenewRequest{AttemptRef: ref(c)} }},
	{wire.OpEvents, func(c wire.Claim) any {
		return wire.EventsRequest{AttemptRef: ref(c), Events: []wire.Event{{Seq: 1, Time: time.Now(), Type: "agent.output"}}}
	}},
	{wire.OpContainer, func(c wire.Claim) any {
		return wire.ContainerRequest{AttemptRef: ref(c), Backend: "process", ContainerID: "proc-1"}
	}},
	{wire.OpAdmission, func(c wire.Claim) any { return wire.AdmissionRequest{AttemptRef: ref(c), ActivationID: "act-1"} }},
	{wire.OpSettlement, func(c wire.Claim) any {
		return wire.SettlementRequest{AttemptRef: ref(c), ActivationID: "act-1",
			Supervisor: wire.SupervisorReceipt{ActivationID: "act-1", ReceiptID: "sr-1", NativeTurn: 1}}
	}},
	{wire.OpNotices, func(c wire.Claim) any {
		return wire.NoticeRequest{AttemptRef: ref(c), Kind: wire.NoticeSharedWorkspaceSettled}
	}},
	{wire.OpAbandon, func(c wire.Claim) any { return wire.AbandonRequest{AttemptRef: ref(c), Class: "preflight"} }},
	{wire.OpRelease, func(c wire.Claim) any { return wire.ReleaseRequest{AttemptRef: ref(c), Class: "spawn_failed"} }},
	{wire.OpFinish, func(c wire.Claim) any {
		return wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit"}
	}},
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every worker call refuses a malformed, unknown-field, oversize, trailing
// or empty body with 400 and its code, and never echoes the body.
func TestWorkerCallsRefuseBadBodies(t *testing.T) {
	f := newFixture(t)
	c := f.turn()
	calls := []struct{ path, token string }{
		{wire.PathClaim, f.hostToken},
		{wire.PathHostHeartbeat, f.hostToken},
	}
	for _, o := range attemptOps {
		calls = append(calls, struct{ path, token string }{wire.AttemptPath(c.JobID, o.op), c.WorkerToken})
	}
	bodies := []struct {
		name, body, code string
	}{
		{"malformed", `{"attempt_id": SECRET-1`, wire.CodeBadJSON},
		{"wrong type", `["SECRET-2"]`, wire.CodeBadJSON},
		{"unknown field", `{"SECRET-3": 1}`, wire.CodeUnknownField},
		{"trailing data", `{} {"x": "SECRET-4"}`, wire.CodeBadJSON},
		{"trailing garbage", `{} SECRET-5`, wire.CodeBadJSON},
		{"empty", ``, wire.CodeBadJSON},
		{"oversize", `{"attempt_id": "SECRET-6` + strings.Repeat("a", wire.MaxBodyBytes) + `"}`, wire.CodeBodyTooLarge},
	}
	for _, call := range calls {
		for _, b := range bodies {
			t.Run(call.path+"/"+b.name, func(t *testing.T) {
				raw := f.expect(http.MethodPost, call.path, call.token, b.body, http.StatusBadRequest, b.code)
				if strings.Contains(string(raw), "SECRET") {
					t.Fatalf("answer echoes the body: %s", raw)
				}
			})
		}
	}
	// Nothing above changed the attempt: it still renews.
	if _, err := f.wc.Renew(context.Background(), c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
		t.Fatalf("renew after bad bodies: %v", err)
	}
}

// Well-formed bodies with a wrong field are 400 invalid.
func TestWorkerCallsRefuseInvalidFields(t *testing.T) {
	f := newFixture(t)
	c := f.turn()
	ap := func(op string) string { return wire.AttemptPath(c.JobID, op) }
	a := fmt.Sprintf(`"attempt_id": %q, "lease_generation": %d`, c.AttemptID, c.LeaseGeneration)
	cases := []struct{ name, path, token, body string }{
		{"claim negative wait", wire.PathClaim, f.hostToken, `{"wait_ms": -1}`},
		{"claim lease too short", wire.PathClaim, f.hostToken, `{"lease_ttl_ms": 39999}`},
		{"claim lease too long", wire.PathClaim, f.hostToken, `{"lease_ttl_ms": 86400000}`},
		{"heartbeat negative capacity", wire.PathHostHeartbeat, f.hostToken, `{"capacity": -1}`},
		{"heartbeat launch error without class", wire.PathHostHeartbeat, f.hostToken, `{"capacity": 1, "launch_error": {"consecutive": 2}}`},
		{"no attempt id", ap(wire.OpRenew), c.WorkerToken, `{"lease_generation": 1}`},
		{"generation zero", ap(wire.OpRenew), c.WorkerToken, fmt.Sprintf(`{"attempt_id": %q}`, c.AttemptID)},
		{"renew lease too short", ap(wire.OpRenew), c.WorkerToken, `{` + a + `, "lease_ttl_ms": 1000}`},
		{"event without type", ap(wire.OpEvents), c.WorkerToken, `{` + a + `, "events": [{"seq": 1}]}`},
		{"event seq zero", ap(wire.OpEvents), c.WorkerToken, `{` + a + `, "events": [{"seq": 0, "type": "x"}]}`},
		{"container backend", ap(wire.OpContainer), c.WorkerToken, `{` + a + `, "backend": "vm", "container_id": "x"}`},
		{"container id", ap(wire.OpContainer), c.WorkerToken, `{` + a + `, "backend": "docker"}`},
		{"admission activation", ap(wire.OpAdmission), c.WorkerToken, `{` + a + `}`},
		{"settlement activation mismatch", ap(wire.OpSettlement), c.WorkerToken,
			`{` + a + `, "activation_id": "a1", "supervisor_receipt": {"activation_id": "a2", "receipt_id": "r"}}`},
		{"settlement receipt", ap(wire.OpSettlement), c.WorkerToken, `{` + a + `, "activation_id": "a1", "supervisor_receipt": {"activation_id": "a1"}}`},
		{"settlement without supervisor activation", ap(wire.OpSettlement), c.WorkerToken,
			`{` + a + `, "activation_id": "a1", "supervisor_receipt": {"receipt_id": "r"}}`},
		{"notice kind", ap(wire.OpNotices), c.WorkerToken, `{` + a + `, "kind": "something_else"}`},
		{"abandon class", ap(wire.OpAbandon), c.WorkerToken, `{` + a + `}`},
		{"release class", ap(wire.OpRelease), c.WorkerToken, `{` + a + `, "class": "felt_like_it"}`},
		{"release declined without class", ap(wire.OpRelease), c.WorkerToken, `{` + a + `, "class": "declined:"}`},
		{"finish outcome", ap(wire.OpFinish), c.WorkerToken, `{` + a + `, "outcome": "done"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.expect(http.MethodPost, tc.path, tc.token, tc.body, http.StatusBadRequest, wire.CodeInvalid)
		})
	}
	if j := f.job(c.JobID); j.State != wire.JobRunning {
		t.Fatalf("job state after invalid calls %q, want running", j.State)
	}
}

// The worker token is the attempt's credential: none or a host token is
// 401, another job's token 403, an unknown job 404, and a body naming
// another attempt 403 — on every attempt-scoped call.
func TestAttemptCallsCheckTheWorkerToken(t *testing.T) {
	f := newFixture(t)
	a := f.turn()
	b := f.turn()
	if a.JobID == b.JobID {
		t.Fatal("two turns of two conversations claimed the same job")
	}
	for _, o := range attemptOps {
		t.Run(o.op, func(t *testing.T) {
			body := mustJSON(t, o.body(a))
			path := wire.AttemptPath(a.JobID, o.op)
			f.expect(http.MethodPost, path, "", body, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(http.MethodPost, path, "rdw_nobody-holds-this", body, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(http.MethodPost, path, f.hostToken, body, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(http.MethodPost, path, userToken, body, http.StatusUnauthorized, wire.CodeUnauthorized)
			f.expect(http.MethodPost, path, b.WorkerToken, mustJSON(t, o.body(b)), http.StatusForbidden, wire.CodeForbidden)
			f.expect(http.MethodPost, wire.AttemptPath("no-such-job", o.op), a.WorkerToken, body, http.StatusNotFound, wire.CodeNotFound)
			// The right token with a body naming another attempt.
			f.expect(http.MethodPost, path, a.WorkerToken, mustJSON(t, o.body(b)), http.StatusForbidden, wire.CodeForbidden)
		})
	}
	// Host calls refuse worker and unknown tokens.
	for _, path := range []string{wire.PathClaim, wire.PathHostHeartbeat} {
		f.expect(http.MethodPost, path, "", `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
		f.expect(http.MethodPost, path, a.WorkerToken, `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
		f.expect(http.MethodPost, path, userToken, `{}`, http.StatusUnauthorized, wire.CodeUnauthorized)
	}
	// None of it touched either attempt.
	for _, c := range []wire.Claim{a, b} {
		if j := f.job(c.JobID); j.State != wire.JobRunning || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptRunning {
			t.Fatalf("job %s after refused calls: state %q, attempts %+v", c.JobID, j.State, j.Attempts)
		}
	}
}

// A superseded attempt's reports are refused with 409 lease_lost on every
// call, and each refusal is kept as a lease.stale_report event (P1).
func TestSupersededGenerationIsRefusedAndRecorded(t *testing.T) {
	f := newFixture(t)
	old := f.turn()
	if old.LeaseGeneration != 1 {
		t.Fatalf("first claim generation %d, want 1", old.LeaseGeneration)
	}
	f.clock.Advance(controlplane.DefaultLeaseTTL + controlplane.DefaultReaperGrace + time.Second)
	f.srv.Sweep(context.Background())
	cur := f.claim()
	if cur.JobID != old.JobID || cur.LeaseGeneration != 2 {
		t.Fatalf("reclaim: job %s generation %d, want job %s generation 2", cur.JobID, cur.LeaseGeneration, old.JobID)
	}
	for _, o := range attemptOps {
		t.Run(o.op, func(t *testing.T) {
			f.expect(http.MethodPost, wire.AttemptPath(old.JobID, o.op), old.WorkerToken, mustJSON(t, o.body(old)),
				http.StatusConflict, wire.CodeLeaseLost)
		})
	}
	// The live attempt's token with the old generation is stale as well.
	stale := cur
	stale.LeaseGeneration = 1
	f.expect(http.MethodPost, wire.AttemptPath(cur.JobID, wire.OpRenew), cur.WorkerToken,
		mustJSON(t, wire.RenewRequest{AttemptRef: ref(stale)}), http.StatusConflict, wire.CodeLeaseLost)

	j := f.job(old.JobID)
	var staleReports int
	for _, e := range j.Events {
		if e.Type == "lease.stale_report" {
			staleReports++
			if e.Time.IsZero() {
				t.Fatalf("stale report without a time: %+v", e)
			}
		}
	}
	if staleReports < len(attemptOps)+1 {
		t.Fatalf("%d lease.stale_report events, want at least %d; events: %+v", staleReports, len(attemptOps)+1, j.Events)
	}
	if !hasEvent(j, "attempt_superseded") {
		t.Fatalf("no attempt_superseded event: %+v", j.Events)
	}
	// The live attempt is untouched by all of it.
	if _, err := f.wc.Renew(context.Background(), cur.WorkerToken, cur.JobID, wire.RenewRequest{AttemptRef: ref(cur)}); err != nil {
		t.Fatalf("live attempt renew: %v", err)
	}
}

// One turn through every call with the thin client; repeated receipts get
// the first answer; the job shows each attempt's lease owner, expiry and
// generation and timestamped events (R19, R27, P2).
func TestTurnThroughEveryCall(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	now := f.clock.Now()

	hb, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2, Version: "test"})
	if err != nil || !hb.ServerTime.Equal(now) {
		t.Fatalf("heartbeat: %+v, %v", hb, err)
	}
	if _, err := f.wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err != wire.ErrNoClaim {
		t.Fatalf("claim on an empty queue: %v, want ErrNoClaim (204)", err)
	}
	conv := f.newConversation()
	queued := f.send(conv.ID, "hello")
	if queued.State != wire.JobQueued || queued.Seq != 1 {
		t.Fatalf("enqueued job %+v", queued)
	}
	c := f.claim()
	switch {
	case c.JobID != queued.ID, c.LeaseGeneration != 1, c.Turn.Prompt != "hello", c.Turn.ConversationID != conv.ID:
		t.Fatalf("claim %+v", c)
	case !strings.HasPrefix(c.WorkerToken, controlplane.WorkerTokenPrefix) || len(c.WorkerToken) < 40:
		t.Fatalf("worker token %q is not a 256-bit token", c.WorkerToken)
	case c.LeaseTTLMS != controlplane.DefaultLeaseTTL.Milliseconds() || !c.LeaseExpiresAt.Equal(now.Add(controlplane.DefaultLeaseTTL)):
		t.Fatalf("claim lease %d ms until %v, want default from %v", c.LeaseTTLMS, c.LeaseExpiresAt, now)
	}
	r := ref(c)
	tok, job := c.WorkerToken, c.JobID

	f.clock.Advance(30 * time.Second)
	rn, err := f.wc.Renew(ctx, tok, job, wire.RenewRequest{AttemptRef: r, LeaseTTLMS: 60_000})
	if err != nil || rn.CancelRequested || rn.LeaseTTLMS != 60_000 || !rn.LeaseExpiresAt.Equal(f.clock.Now().Add(time.Minute)) {
		t.Fatalf("renew: %+v, %v", rn, err)
	}
	batch := wire.EventsRequest{AttemptRef: r, Events: []wire.Event{
		{Seq: 1, Time: f.clock.Now(), Type: "agent.output", Data: json.RawMessage(`{"text":"hi"}`)},
		{Seq: 2, Time: f.clock.Now(), Type: "agent.output"},
	}}
	for range 2 { // the second is a batch repeated after a lost answer
		if er, err := f.wc.Events(ctx, tok, job, batch); err != nil || er.StoredThrough != 2 {
			t.Fatalf("events: %+v, %v", er, err)
		}
	}
	if err := f.wc.Container(ctx, tok, job, wire.ContainerRequest{AttemptRef: r, Backend: "process", ContainerID: "proc-7"}); err != nil {
		t.Fatalf("container: %v", err)
	}
	if _, err := f.wc.Settlement(ctx, tok, job, wire.SettlementRequest{AttemptRef: r, ActivationID: "act-1",
		Supervisor: wire.SupervisorReceipt{ActivationID: "act-1", ReceiptID: "sr-1", NativeTurn: 1}}); err == nil {
		t.Fatal("settlement before admission succeeded")
	} else if st, code := statusOf(err); st != http.StatusConflict || code != wire.CodeNotAdmitted {
		t.Fatalf("settlement before admission: %v", err)
	}
	adm, err := f.wc.Admission(ctx, tok, job, wire.AdmissionRequest{AttemptRef: r, ActivationID: "act-1"})
	if err != nil || adm.ReceiptID == "" || adm.JobID != job || adm.ActivationID != "act-1" {
		t.Fatalf("admission: %+v, %v", adm, err)
	}
	f.clock.Advance(time.Second)
	if again, err := f.wc.Admission(ctx, tok, job, wire.AdmissionRequest{AttemptRef: r, ActivationID: "act-1"}); err != nil || again != adm {
		t.Fatalf("repeated admission: %+v, %v; want the first receipt %+v", again, err, adm)
	}
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"release", func() error {
			return f.wc.Release(ctx, tok, job, wire.ReleaseRequest{AttemptRef: r, Class: "spawn_failed"})
		}},
		{"abandon", func() error {
			_, err := f.wc.Abandon(ctx, tok, job, wire.AbandonRequest{AttemptRef: r, Class: "preflight"})
			return err
		}},
	} {
		if st, code := statusOf(op.call()); st != http.StatusConflict || code != wire.CodeAdmitted {
			t.Fatalf("%s of an admitted job: HTTP %d %q, want 409 admitted", op.name, st, code)
		}
	}
	set := wire.SettlementRequest{AttemptRef: r, ActivationID: "act-1",
		Supervisor: wire.SupervisorReceipt{ActivationID: "act-1", ReceiptID: "sr-1", NativeTurn: 1}}
	bd, err := f.wc.Settlement(ctx, tok, job, set)
	if err != nil || bd.SnapshotID == "" {
		t.Fatalf("settlement: %+v, %v", bd, err)
	}
	f.clock.Advance(time.Second)
	if again, err := f.wc.Settlement(ctx, tok, job, set); err != nil || again != bd {
		t.Fatalf("repeated settlement: %+v, %v; want the first boundary %+v", again, err, bd)
	}
	if err := f.wc.Notice(ctx, tok, job, wire.NoticeRequest{AttemptRef: r, Kind: wire.NoticeSharedWorkspaceSettled, Boundary: bd}); err != nil {
		t.Fatalf("notice: %v", err)
	}
	fin := wire.FinishRequest{AttemptRef: r, Outcome: wire.OutcomeSucceeded}
	fr, err := f.wc.Finish(ctx, tok, job, fin)
	if err != nil || fr.JobState != wire.JobSucceeded || fr.ConversationState != wire.ConversationUsable {
		t.Fatalf("finish: %+v, %v", fr, err)
	}
	f.clock.Advance(time.Second)
	if again, err := f.wc.Finish(ctx, tok, job, fin); err != nil || again != fr {
		t.Fatalf("repeated finish: %+v, %v; want the first answer %+v", again, err, fr)
	}

	j := f.job(job)
	if j.State != wire.JobSucceeded || !j.Admitted || j.AttemptCount != 1 || len(j.Attempts) != 1 {
		t.Fatalf("job after the turn: %+v", j)
	}
	at := j.Attempts[0]
	if at.ID != c.AttemptID || at.LeaseOwner != "host-a" || at.Generation != 1 || at.LeaseExpiresAt.IsZero() ||
		at.ClaimedAt.IsZero() || at.ContainerID != "proc-7" || at.ActivationID != "act-1" {
		t.Fatalf("attempt record %+v", at)
	}
	var runner int
	for _, e := range j.Events {
		if e.Time.IsZero() || e.ID == 0 {
			t.Fatalf("event without time or id: %+v", e)
		}
		if e.Source == "runner" {
			runner++
		}
	}
	if runner != 2 {
		t.Fatalf("%d runner events stored, want 2 (a repeated batch is stored once): %+v", runner, j.Events)
	}
	var page wire.JobEventList
	f.user(http.MethodGet, "/v1/jobs/"+job+"/events?after=0", nil, &page)
	if !page.Ended || len(page.Events) != len(j.Events) {
		t.Fatalf("events page: ended %v, %d events, want ended with %d", page.Ended, len(page.Events), len(j.Events))
	}
	last := page.Events[len(page.Events)-1].ID
	f.user(http.MethodGet, fmt.Sprintf("/v1/jobs/%s/events?after=%d&wait_ms=5000", job, last), nil, &page)
	if !page.Ended || len(page.Events) != 0 {
		t.Fatalf("events after the last: %+v, want none and ended (at once, the job is over)", page)
	}
	var cv wire.Conversation
	f.user(http.MethodGet, "/v1/conversations/"+conv.ID, nil, &cv)
	if cv.State != wire.ConversationUsable || cv.Epoch != bd.WorkspaceEpoch || cv.NativeTurn != 1 || cv.ContainerID != "proc-7" {
		t.Fatalf("conversation after the turn: %+v (boundary %+v)", cv, bd)
	}

	// Neither records nor answers other than the claim carry a token.
	for _, secret := range []string{tok, f.hostToken, userToken} {
		if strings.Contains(f.logs.String(), secret) {
			t.Fatalf("a record holds a token: %s", f.logs.String())
		}
	}
}

// A release puts a never-admitted job back in the queue with the next
// generation, after its release backoff (K7); the released attempt's token
// is then stale.
func TestReleaseRequeues(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.turn()
	if err := f.wc.Release(ctx, c.WorkerToken, c.JobID, wire.ReleaseRequest{AttemptRef: ref(c), Class: "declined:preflight_image"}); err != nil {
		t.Fatalf("release: %v", err)
	}
	if j := f.job(c.JobID); j.State != wire.JobQueued || j.Attempts[0].State != wire.AttemptReleased {
		t.Fatalf("after release: state %q, attempts %+v", j.State, j.Attempts)
	}
	if _, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err == nil {
		t.Fatal("renew of a released attempt succeeded")
	} else if st, _ := statusOf(err); wire.ClassifyStatus(st) == wire.Transient {
		t.Fatalf("renew of a released attempt: %v, want a definitive refusal", err)
	}
	f.clock.Advance(store.DefaultReleaseBackoff)
	again := f.claim()
	if again.JobID != c.JobID || again.LeaseGeneration != 2 || again.WorkerToken == c.WorkerToken {
		t.Fatalf("reclaim after release: %+v", again)
	}
}

// Abandon before admission with a recorded container fails the turn and
// keeps the conversation usable (R29): its next message runs.
func TestAbandonKeepsConversationUsable(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	c := f.turn()
	if err := f.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref(c), Backend: "docker", ContainerID: "ctr-1"}); err != nil {
		t.Fatal(err)
	}
	fr, err := f.wc.Abandon(ctx, c.WorkerToken, c.JobID, wire.AbandonRequest{AttemptRef: ref(c), Class: "image_missing", Reason: "image not present"})
	if err != nil || fr.JobState != wire.JobFailed || fr.ConversationState != wire.ConversationUsable {
		t.Fatalf("abandon: %+v, %v", fr, err)
	}
	next := f.send(c.Turn.ConversationID, "again")
	if got := f.claim(); got.JobID != next.ID || got.Turn.ContainerID != "ctr-1" {
		t.Fatalf("next turn claim %+v, want job %s with the retained container", got, next.ID)
	}
}

// GET /v1/jobs/{id} shows every attempt with its lease owner, lease expiry
// and generation, and the job's timestamped events, so that runner records
// can be correlated with them (R19) — also across a superseded attempt.
func TestJobRecordsLeaseOwnerExpiryAndEvents(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	hostB := f.addHost("host-b")
	claimedA := f.clock.Now()
	a := f.turn()

	f.clock.Advance(30 * time.Second)
	renewedA := f.clock.Now()
	if _, err := f.wc.Renew(ctx, a.WorkerToken, a.JobID, wire.RenewRequest{AttemptRef: ref(a), LeaseTTLMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Minute + controlplane.DefaultReaperGrace + time.Second)
	swept := f.clock.Now()
	f.srv.Sweep(ctx)
	b, err := f.wc.Claim(ctx, hostB, wire.ClaimRequest{})
	if err != nil || b.JobID != a.JobID {
		t.Fatalf("host-b's claim: %+v, %v", b, err)
	}

	j := f.job(a.JobID)
	if len(j.Attempts) != 2 {
		t.Fatalf("attempts %+v, want 2", j.Attempts)
	}
	for i, want := range []struct {
		id, owner, state string
		gen              int64
		claimed, expires time.Time
	}{
		{a.AttemptID, "host-a", wire.AttemptSuperseded, 1, claimedA, renewedA.Add(time.Minute)},
		{b.AttemptID, "host-b", wire.AttemptRunning, 2, swept, swept.Add(controlplane.DefaultLeaseTTL)},
	} {
		got := j.Attempts[i]
		if got.ID != want.id || got.LeaseOwner != want.owner || got.State != want.state || got.Generation != want.gen ||
			!got.ClaimedAt.Equal(want.claimed) || !got.LeaseExpiresAt.Equal(want.expires) {
			t.Fatalf("attempt %d: %+v\nwant %+v", i, got, want)
		}
	}
	at := map[string]time.Time{}
	for _, e := range j.Events {
		if e.Type == "claimed" {
			var d struct {
				Owner string `json:"lease_owner"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil || d.Owner == "" {
				t.Fatalf("claimed event without its lease owner: %s", e.Data)
			}
			at["claimed "+d.Owner] = e.Time
			continue
		}
		at[e.Type] = e.Time
	}
	if !at["claimed host-a"].Equal(claimedA) || !at["claimed host-b"].Equal(swept) || !at["attempt_superseded"].Equal(swept) {
		t.Fatalf("event times %v; want host-a's claim at %v, the supersession and host-b's claim at %v", at, claimedA, swept)
	}
}

// A failure the store did not decide (here its database is closed) answers
// 503, which runners retry, and leaves one record with the operation and a
// class — no error text, no token.
func TestStoreFailureIsRetryable(t *testing.T) {
	f := newFixture(t)
	c := f.turn()
	if err := f.st.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := f.wc.Renew(context.Background(), c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)})
	if st, code := statusOf(err); st != http.StatusServiceUnavailable || code != wire.CodeInternal || wire.Classify(err) != wire.Transient {
		t.Fatalf("renew on a failed store: %v, want 503 internal (transient)", err)
	}
	var rec struct {
		Msg    string `json:"msg"`
		Op     string `json:"op"`
		Status int    `json:"status"`
		Class  string `json:"class"`
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(f.logs.String()), "\n") {
		if strings.Contains(line, `"controlplane_request_failed"`) {
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatal(err)
			}
			found = true
			if strings.Contains(line, "closed") || strings.Contains(line, c.WorkerToken) {
				t.Fatalf("the record holds error text or a token: %s", line)
			}
		}
	}
	if !found || rec.Op != wire.OpRenew || rec.Status != http.StatusServiceUnavailable || rec.Class == "" {
		t.Fatalf("failure record %+v (found %v) in\n%s", rec, found, f.logs.String())
	}
}
