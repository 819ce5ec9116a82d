package controlplane_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// batchItem is one item of a worker batch: op of c's attempt with body.
func batchItem(t *testing.T, c wire.Claim, op string, body any) wire.BatchItem {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return wire.BatchItem{Op: op, JobID: c.JobID, WorkerToken: c.WorkerToken, Body: b}
}

// lease is the expiry of the job's last attempt's lease.
func lease(j wire.Job) time.Time {
	if len(j.Attempts) == 0 {
		return time.Time{}
	}
	return j.Attempts[len(j.Attempts)-1].LeaseExpiresAt
}

// batch posts items with the host token and decodes the answer; it fails
// the test unless the request itself was answered 200.
func (f *fixture) batch(hostToken string, items ...wire.BatchItem) []wire.BatchResult {
	f.t.Helper()
	b, err := json.Marshal(wire.WorkerBatch{Items: items})
	if err != nil {
		f.t.Fatal(err)
	}
	status, body := f.do(http.MethodPost, wire.PathWorkerBatch, hostToken, string(b))
	if status != http.StatusOK {
		f.t.Fatalf("batch: HTTP %d %s", status, body)
	}
	var out wire.WorkerBatchResponse
	if err := json.Unmarshal(body, &out); err != nil || len(out.Results) != len(items) {
		f.t.Fatalf("batch answer %s: %d results for %d items, %v", body, len(out.Results), len(items), err)
	}
	if strings.Contains(string(body), controlplane.WorkerTokenPrefix) {
		f.t.Fatalf("the batch answer holds a worker token: %s", body)
	}
	return out.Results
}

// A mixed batch of two attempts' calls is answered item by item, each
// with what its per-call endpoint answers: renewals, events, container,
// admission and a finish after its events (the same job's items run in
// their order), on both stores; the answers are the store's, and the
// worker tokens reach no record.
func TestWorkerBatchMixed(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		a, b := f.turn(), f.turn()
		ev := func(seq int64) wire.Event { return wire.Event{Seq: seq, Time: f.clock.Now(), Type: "agent_message"} }
		res := f.batch(f.hostToken,
			batchItem(t, a, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(a)}),
			batchItem(t, b, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(b)}),
			batchItem(t, a, wire.OpEvents, wire.EventsRequest{AttemptRef: ref(a), Events: []wire.Event{ev(1), ev(2)}}),
			batchItem(t, b, wire.OpContainer, wire.ContainerRequest{AttemptRef: ref(b), Backend: "process", ContainerID: "pid-1"}),
			batchItem(t, b, wire.OpAdmission, wire.AdmissionRequest{AttemptRef: ref(b), ActivationID: "act-b"}),
			batchItem(t, a, wire.OpEvents, wire.EventsRequest{AttemptRef: ref(a), Events: []wire.Event{ev(3)}}),
			batchItem(t, a, wire.OpFinish, wire.FinishRequest{AttemptRef: ref(a), Outcome: wire.OutcomeFailed, Class: "batch_test"}),
			// After a's finish in the same batch: its lease is over.
			batchItem(t, a, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(a)}),
		)
		for i, want := range []int{200, 200, 200, 200, 200, 200, 200, 409} {
			if res[i].Status != want {
				t.Fatalf("item %d: HTTP %d %s, want %d", i, res[i].Status, res[i].Body, want)
			}
		}
		var renewed wire.RenewResponse
		if err := json.Unmarshal(res[0].Body, &renewed); err != nil || renewed.LeaseExpiresAt.IsZero() || renewed.LeaseTTLMS != controlplane.DefaultLeaseTTL.Milliseconds() {
			t.Fatalf("renewal answer %s: %+v %v", res[0].Body, renewed, err)
		}
		var stored wire.EventsResponse
		if err := json.Unmarshal(res[5].Body, &stored); err != nil || stored.StoredThrough != 3 {
			t.Fatalf("events answer %s, want stored_through 3 (after the first events item)", res[5].Body)
		}
		var receipt wire.AdmissionReceipt
		if err := json.Unmarshal(res[4].Body, &receipt); err != nil || receipt.ActivationID != "act-b" {
			t.Fatalf("admission answer %s", res[4].Body)
		}
		if code(res[7].Body) != wire.CodeLeaseLost {
			t.Fatalf("renewal after the finish: %s, want lease_lost", res[7].Body)
		}
		if j := f.job(a.JobID); j.State != wire.JobFailed {
			t.Fatalf("job a is %s after the batch's finish, want failed", j.State)
		}
		if j := f.job(b.JobID); j.State != wire.JobRunning {
			t.Fatalf("job b is %s, want running", j.State)
		}
		// The same answers as the per-call endpoint gives: a renewal of b now.
		if _, err := f.wc.Renew(t.Context(), b.WorkerToken, b.JobID, wire.RenewRequest{AttemptRef: ref(b)}); err != nil {
			t.Fatalf("per-call renewal of b after the batch: %v", err)
		}
		if strings.Contains(f.logs.String(), a.WorkerToken) || strings.Contains(f.logs.String(), b.WorkerToken) {
			t.Fatal("a worker token reached the control plane's records")
		}
	})
}

// Each item is fenced and refused on its own, the others answered: a
// stale lease generation (409 lease_lost), a token nobody holds (401), a
// token of another job (403), and a real token of another host's attempt
// (403, never dispatched: that host's lease is not renewed by it).
func TestWorkerBatchRefusesItemsOnTheirOwn(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		mine := f.turn()
		otherHost := f.addHost("host-b")
		f.send(f.newConversation().ID, "theirs")
		theirs, err := f.wc.Claim(t.Context(), otherHost, wire.ClaimRequest{})
		if err != nil {
			t.Fatalf("host-b claims: %v", err)
		}
		stale := ref(mine)
		stale.LeaseGeneration++
		wrongToken := batchItem(t, mine, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(mine)})
		wrongToken.WorkerToken = controlplane.NewToken(controlplane.WorkerTokenPrefix)
		otherJob := batchItem(t, mine, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(mine)})
		otherJob.WorkerToken = theirs.WorkerToken
		before := f.job(theirs.JobID)
		f.clock.Advance(time.Second) // a renewal would move the lease
		res := f.batch(f.hostToken,
			batchItem(t, mine, wire.OpRenew, wire.RenewRequest{AttemptRef: stale}),
			wrongToken,
			batchItem(t, theirs, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(theirs)}),
			batchItem(t, theirs, wire.OpFinish, wire.FinishRequest{AttemptRef: ref(theirs), Outcome: wire.OutcomeFailed}),
			otherJob,
			batchItem(t, mine, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(mine)}),
		)
		want := []struct {
			status int
			code   string
		}{{409, wire.CodeLeaseLost}, {401, wire.CodeUnauthorized}, {403, wire.CodeForbidden}, {403, wire.CodeForbidden}, {403, wire.CodeForbidden}, {200, ""}}
		for i, w := range want {
			if res[i].Status != w.status || code(res[i].Body) != w.code {
				t.Fatalf("item %d: HTTP %d %s, want %d %q", i, res[i].Status, res[i].Body, w.status, w.code)
			}
		}
		if !strings.Contains(string(res[2].Body), "another host") {
			t.Fatalf("another host's attempt refused as %s, want the other-host refusal", res[2].Body)
		}
		after := f.job(theirs.JobID)
		if after.State != wire.JobRunning || !lease(after).Equal(lease(before)) {
			t.Fatalf("host-b's job went %s with lease %v (was %v): another host's batch touched it", after.State, lease(after), lease(before))
		}
		// host-b's own batch still works with its token.
		if r := f.batch(otherHost, batchItem(t, theirs, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(theirs)})); r[0].Status != 200 {
			t.Fatalf("host-b's own renewal in a batch: %d %s", r[0].Status, r[0].Body)
		}
	})
}

// A batch that is wrong as a whole is refused 400 naming what is wrong,
// and none of its items runs; a batch without a host token is 401.
func TestWorkerBatchBadInput(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		c := f.turn()
		renew := func() wire.BatchItem {
			return batchItem(t, c, wire.OpRenew, wire.RenewRequest{AttemptRef: ref(c)})
		}
		enc := func(items ...wire.BatchItem) string {
			b, _ := json.Marshal(wire.WorkerBatch{Items: items})
			return string(b)
		}
		unknownOp := renew()
		unknownOp.Op = "permissions"
		noToken := renew()
		noToken.WorkerToken = ""
		noJob := renew()
		noJob.JobID = "../claim"
		many := make([]wire.BatchItem, wire.MaxBatchItems+1)
		for i := range many {
			many[i] = renew()
		}
		for _, tc := range []struct {
			name, body, code, says string
		}{
			{"unknown op", enc(renew(), unknownOp), wire.CodeInvalid, "items[1].op"},
			{"no worker token", enc(noToken), wire.CodeInvalid, "items[0].worker_token"},
			{"bad job id", enc(noJob), wire.CodeInvalid, "items[0].job_id"},
			{"too many items", enc(many...), wire.CodeInvalid, "at most 256"},
			{"no items", `{"items":[]}`, wire.CodeInvalid, "at least one"},
			{"no items field", `{}`, wire.CodeInvalid, "items"},
			{"unknown field", `{"items":[],"extra":1}`, wire.CodeUnknownField, "field"},
			{"unknown item field", `{"items":[{"op":"renew","job_id":"j","worker_token":"t","body":{},"x":1}]}`, wire.CodeUnknownField, "field"},
			{"not json", `{"items":`, wire.CodeBadJSON, "JSON"},
		} {
			b := f.expect(http.MethodPost, wire.PathWorkerBatch, f.hostToken, tc.body, http.StatusBadRequest, tc.code)
			var eb wire.ErrorBody
			if json.Unmarshal(b, &eb) != nil || !strings.Contains(eb.Message, tc.says) {
				t.Fatalf("%s: refused %s, want a message naming %q", tc.name, b, tc.says)
			}
			if strings.Contains(string(b), c.WorkerToken) {
				t.Fatalf("%s: the refusal echoes a worker token", tc.name)
			}
		}
		before := lease(f.job(c.JobID))
		f.clock.Advance(time.Second) // a renewal would move the lease
		f.expect(http.MethodPost, wire.PathWorkerBatch, "", enc(renew()), http.StatusUnauthorized, wire.CodeUnauthorized)
		// A worker token is not a host token.
		f.expect(http.MethodPost, wire.PathWorkerBatch, c.WorkerToken, enc(renew()), http.StatusUnauthorized, wire.CodeUnauthorized)
		if got := lease(f.job(c.JobID)); !got.Equal(before) {
			t.Fatalf("a refused batch renewed the lease: %v, was %v", got, before)
		}
		// An item's own bad body is that item's 400, as per call.
		bad := wire.BatchItem{Op: wire.OpRenew, JobID: c.JobID, WorkerToken: c.WorkerToken, Body: json.RawMessage(`{"attempt_id":"x","lease_generation":1,"nope":1}`)}
		if r := f.batch(f.hostToken, bad, renew()); r[0].Status != 400 || code(r[0].Body) != wire.CodeUnknownField || r[1].Status != 200 {
			t.Fatalf("an item with an unknown field: %d %s, then %d", r[0].Status, r[0].Body, r[1].Status)
		}
	})
}
