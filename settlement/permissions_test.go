package settlement_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// A4: the child's poll for the owner's answer is a read that decides
// nothing about the lease. A refusal (a control plane without the call
// answers 404) is returned and the session is not fenced: its next call
// still goes out. Without an answer the poll is held its wait and answers
// ""; once the owner's answer is recorded it answers the option.
func TestPermissionAnswerPollIsARead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t)
		c := w.turn("", "p")
		s := w.session(c)
		ctx := context.Background()
		ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		if _, err := w.wc.Events(ctx, c.WorkerToken, c.JobID, wire.EventsRequest{AttemptRef: ref, Events: []wire.Event{{Seq: 1, Time: time.Now(),
			Type: wire.EventPermissionRequested, Data: json.RawMessage(`{"request_id":"perm-1","policy":"ask","options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}`)}}}); err != nil {
			t.Fatal(err)
		}

		w.in.Plan(wire.OpPermissions, fault{status: 404})
		if opt, err := s.PermissionAnswer(ctx, "perm-1", time.Second); err == nil || opt != "" {
			t.Fatalf("a 404 answered %q, %v; want the refusal", opt, err)
		}
		if s.Rejected() {
			t.Fatal("a refused poll fenced the session")
		}
		start := time.Now()
		if opt, err := s.PermissionAnswer(ctx, "perm-1", time.Second); err != nil || opt != "" {
			t.Fatalf("no answer yet: %q, %v", opt, err)
		}
		if held := time.Since(start); held < time.Second {
			t.Fatalf("the poll was held %v, want its wait of 1s", held)
		}
		if err := w.st.AnswerPermission(ctx, c.JobID, "perm-1", "allow", time.Now()); err != nil {
			t.Fatal(err)
		}
		if opt, err := s.PermissionAnswer(ctx, "perm-1", time.Second); err != nil || opt != "allow" {
			t.Fatalf("after the owner's answer: %q, %v; want allow", opt, err)
		}
		if n := len(w.in.Hits(wire.OpPermissions)); n != 3 {
			t.Fatalf("%d polls reached the control plane, want 3", n)
		}
	})
}
