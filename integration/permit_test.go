package integration

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// A4 end to end on the process backend, against the SDK's example agent
// under the ask policy: its permission request is pending on the job with
// the agent's options and waits for the owner while the daemon keeps
// renewing the lease (R9: it waits past the lease it had when it was
// asked); the owner's answer over the user API reaches the agent — reject
// skips the tool call, allow completes it — and the supervisor records it
// as the owner's. An answer to the request once answered is 409
// not_pending; an option the request did not offer is 400 invalid naming
// option_id, and the request stays pending. A cancel of the turn while a
// request waits answers it cancelled.
func TestACPExampleAgentOwnerAnswers(t *testing.T) {
	t.Parallel()
	agent := acpExampleAgent(t)
	e := newEnv(t, envOpts{})
	e.startDaemon(nil)
	c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: "acp ask", Image: "demo", AgentCommand: []string{agent},
		AgentProtocol: wire.AgentProtocolACP})
	if err != nil {
		t.Fatal(err)
	}
	if c.PermissionPolicy != wire.PermissionAsk {
		t.Fatalf("policy %q, want ask", c.PermissionPolicy)
	}
	pending := func(j wire.Job) bool { return len(j.PendingPermissions) == 1 }
	statusOf := func(err error) (int, string, string) {
		var se *wire.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("want an HTTP refusal, got %v", err)
		}
		return se.Status, se.Code, se.Message
	}

	// Turn 1: the owner rejects, after waiting longer than a lease.
	j1 := e.send(c.ID, "hello")
	asked := e.waitJob(j1.ID, "to ask for permission", pending)
	req := asked.PendingPermissions[0]
	if len(req.Options) != 2 || req.Options[0].OptionID != "allow" || req.Options[1].OptionID != "reject" || !strings.Contains(string(req.ToolCall), "call_2") {
		t.Fatalf("pending request %+v; want the example agent's call_2 with allow and reject", req)
	}
	expiry := runningAttempt(t, asked).LeaseExpiresAt
	e.waitJob(j1.ID, "to renew its lease while the request waits", func(j wire.Job) bool {
		a := runningAttempt(t, j)
		return time.Now().After(expiry) && a.LeaseExpiresAt.After(expiry) && pending(j)
	})
	if _, err := e.user.Permit(e.ctx, j1.ID, req.RequestID, "maybe"); err != nil {
		if status, code, msg := statusOf(err); status != http.StatusBadRequest || code != wire.CodeInvalid || !strings.Contains(msg, "option_id") {
			t.Fatalf("unknown option: %d %s %q; want 400 invalid naming option_id", status, code, msg)
		}
	} else {
		t.Fatal("an unknown option was accepted")
	}
	if j, err := e.user.Permit(e.ctx, j1.ID, req.RequestID, "reject"); err != nil || len(j.PendingPermissions) != 0 {
		t.Fatalf("answer reject: %v, pending %+v", err, j.PendingPermissions)
	}
	got := e.waitEnded(j1.ID)
	if got.State != wire.JobSucceeded {
		t.Fatalf("turn 1: %s", describeJob(got))
	}
	if text := runnerTexts(got); !strings.Contains(text, "skip the configuration update") || strings.Contains(text, "successfully updated") {
		t.Fatalf("the owner's reject did not reach the agent: %q", text)
	}
	if !hasOwnerAnswer(got, req.RequestID, "reject") {
		t.Fatalf("no permission_answered by the owner with reject: %s", describeJob(got))
	}
	if _, err := e.user.Permit(e.ctx, j1.ID, req.RequestID, "allow"); err != nil {
		if status, code, _ := statusOf(err); status != http.StatusConflict || code != wire.CodeNotPending {
			t.Fatalf("answer to an answered request: %d %s; want 409 not_pending", status, code)
		}
	} else {
		t.Fatal("a second answer was accepted")
	}

	// Turn 2, on the same agent and session: the owner allows.
	j2 := e.send(c.ID, "again")
	req2 := e.waitJob(j2.ID, "to ask for permission", pending).PendingPermissions[0]
	if _, err := e.user.Permit(e.ctx, j2.ID, req2.RequestID, "allow"); err != nil {
		t.Fatalf("answer allow: %v", err)
	}
	got = e.waitEnded(j2.ID)
	if got.State != wire.JobSucceeded || !strings.Contains(runnerTexts(got), "successfully updated the configuration") ||
		!hasOwnerAnswer(got, req2.RequestID, "allow") {
		t.Fatalf("turn 2: the owner's allow did not reach the agent: %s\n%q", describeJob(got), runnerTexts(got))
	}

	// Turn 3: cancelled while its request waits — the request is answered
	// cancelled, and an answer after that is not pending.
	j3 := e.send(c.ID, "to be cancelled")
	req3 := e.waitJob(j3.ID, "to ask for permission", pending).PendingPermissions[0]
	if _, err := e.user.Cancel(e.ctx, j3.ID); err != nil {
		t.Fatal(err)
	}
	got = e.waitEnded(j3.ID)
	if got.State != wire.JobCancelled || !hasAnswer(got, req3.RequestID, `"outcome":"cancelled"`, `"by":"cancel"`) {
		t.Fatalf("turn 3: want cancelled, its request answered cancelled by the cancel: %s", describeJob(got))
	}
	if _, err := e.user.Permit(e.ctx, j3.ID, req3.RequestID, "allow"); err != nil {
		if status, code, _ := statusOf(err); status != http.StatusConflict || code != wire.CodeNotPending {
			t.Fatalf("answer after the cancel: %d %s; want 409 not_pending", status, code)
		}
	} else {
		t.Fatal("an answer after the cancel was accepted")
	}
}

func runningAttempt(t *testing.T, j wire.Job) wire.Attempt {
	t.Helper()
	for _, a := range j.Attempts {
		if a.State == wire.AttemptRunning {
			return a
		}
	}
	t.Fatalf("job %s has no running attempt: %s", j.ID, describeJob(j))
	return wire.Attempt{}
}

// hasOwnerAnswer: the supervisor answered the request with option, by the
// owner.
func hasOwnerAnswer(j wire.Job, requestID, option string) bool {
	return hasAnswer(j, requestID, `"option_id":"`+option+`"`, `"by":"owner"`)
}

// hasAnswer: the supervisor's permission_answered of the request holds
// every one of parts.
func hasAnswer(j wire.Job, requestID string, parts ...string) bool {
	for _, ev := range j.Events {
		d := string(ev.Data)
		if ev.Type != wire.EventPermissionAnswered || !strings.Contains(d, `"request_id":"`+requestID+`"`) {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(d, p)
		}
		if all {
			return true
		}
	}
	return false
}
