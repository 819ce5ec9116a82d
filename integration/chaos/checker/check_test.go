package checker

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// hist builds a synthetic history, second by second on the recorder's
// clock, and checks it through the Writer and Read like a real one.
type hist struct {
	t      *testing.T
	t0     time.Time
	recs   []Record
	events map[string]int64 // per-job event numbering
}

func newHist(t *testing.T) *hist {
	return &hist{t: t, t0: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), events: map[string]int64{}}
}

func (h *hist) at(s float64) time.Time { return h.t0.Add(time.Duration(s * float64(time.Second))) }

func (h *hist) add(r Record) *hist {
	h.recs = append(h.recs, r)
	return h
}

// call records one request sent at s and answered at s+0.1 (status 0: no answer).
func (h *hist) call(s float64, host, call, job, att string, gen int64, status int) *hist {
	sent := h.at(s)
	hr := &HTTP{Method: "POST", Call: call, Sent: sent, Status: status}
	if status != 0 {
		a := h.at(s + 0.1)
		hr.Answered = &a
	}
	switch call {
	case CallClaim:
		hr.Path = wire.PathClaim
	case CallSendMessage, CallCancelJob:
	default:
		hr.Path = wire.AttemptPath(job, call)
	}
	return h.add(Record{Time: h.at(s + 0.1), Host: host, Replica: "cp1", JobID: job, AttemptID: att, LeaseGeneration: gen, HTTP: hr})
}

func (h *hist) event(job, att, typ string, data any) *hist {
	h.events[job]++
	var raw json.RawMessage
	if data != nil {
		raw, _ = json.Marshal(data)
	}
	return h.add(Record{JobID: job, Time: h.t0, Event: &wire.JobEvent{ID: h.events[job], JobID: job, AttemptID: att, Source: "control", Type: typ, Data: raw}})
}

func (h *hist) send(s float64, conv, job string) *hist {
	return h.add(Record{Time: h.at(s), ConversationID: conv, JobID: job,
		HTTP: &HTTP{Method: "POST", Path: "/v1/conversations/" + conv + "/messages", Call: CallSendMessage, Sent: h.at(s), Status: 201}})
}

func (h *hist) job(conv, job, state string, atts ...wire.Attempt) *hist {
	return h.add(Record{Time: h.at(1000), Job: &wire.Job{ID: job, ConversationID: conv, State: state, Prompt: "prompt of " + job, Attempts: atts}})
}

func (h *hist) conv(conv, state string) *hist {
	return h.add(Record{Time: h.at(1000), Conversation: &wire.Conversation{ID: conv, State: state}})
}

func (h *hist) prompt(s float64, host, conv, job string) *hist {
	return h.add(Record{Time: h.at(s), Host: host, ConversationID: conv, Prompt: &Prompt{Text: "prompt of " + job, NativeTurn: 1}})
}

func (h *hist) agent(s float64, host, job, att string, pid int, event string) *hist {
	return h.add(Record{Time: h.at(s), Host: host, JobID: job, AttemptID: att, Process: &Process{Role: RoleAgent, Event: event, PID: pid}})
}

// sv records an agent's (or an ACP agent turn's) start or exit as its
// supervisor records it: by conversation, pid and activation
// (instance.generation), with no attempt.
func (h *hist) sv(s float64, host, conv, role, act string, pid int, event string) *hist {
	return h.add(Record{Time: h.at(s), Host: host, ConversationID: conv, Process: &Process{Role: role, Event: event, PID: pid, Activation: act}})
}

func (h *hist) leftover(host, conv, role string, pid int) *hist {
	return h.add(Record{Time: h.at(1001), Host: host, ConversationID: conv, Leftover: &Leftover{What: LeftoverProcess, Role: role, PID: pid}})
}

func (h *hist) fault(s, e float64, host, conv, kind, role string) *hist {
	end := h.at(e)
	return h.add(Record{Time: end, Host: host, ConversationID: conv, Fault: &Fault{Kind: kind, Role: role, Start: h.at(s), End: &end}})
}

// turn records one whole, healthy turn of job on host from s on: claim,
// renewal, admission, the prompt, settlement and finish, with the store's
// events, the final job state and the agent's start and exit.
func (h *hist) turn(s float64, host, conv, job, att string, gen int64, pid int) *hist {
	h.send(s, conv, job)
	h.call(s+1, host, CallClaim, job, att, gen, 200).event(job, att, "claimed", map[string]any{"lease_generation": gen})
	h.call(s+2, host, wire.OpContainer, job, att, gen, 204).event(job, att, "container_recorded", nil)
	h.call(s+3, host, wire.OpAdmission, job, att, gen, 200).event(job, att, "admitted", nil)
	h.agent(s+3.5, host, job, att, pid, ProcessStart).prompt(s+3.6, host, conv, job)
	h.call(s+4, host, wire.OpRenew, job, att, gen, 200)
	h.agent(s+5, host, job, att, pid, ProcessExit)
	h.call(s+6, host, wire.OpSettlement, job, att, gen, 200).event(job, att, "settled", nil)
	h.call(s+7, host, wire.OpFinish, job, att, gen, 200).event(job, att, "finished", wire.FinishRequest{
		AttemptRef: wire.AttemptRef{AttemptID: att, LeaseGeneration: gen}, Outcome: wire.OutcomeSucceeded})
	return h.job(conv, job, wire.JobSucceeded, wire.Attempt{ID: att, Generation: gen, LeaseOwner: host})
}

// clean is a history that keeps every promise, borderline cases included:
// a job released before acceptance and claimed again, whose repeated
// release after the new claim gets the first answer (P2); a stale renewal
// refused with 409; and a renewal answered 2xx that was sent before the
// later claim was answered.
func clean(t *testing.T) *hist {
	h := newHist(t)
	h.turn(0, "h1", "c1", "j1", "a1", 1, 101)
	h.turn(10, "h2", "c2", "j2", "a2", 1, 102)
	// j3: released by h1 (the child never accepted), claimed again by h2.
	h.send(20, "c1", "j3")
	h.call(21, "h1", CallClaim, "j3", "a3", 1, 200).event("j3", "a3", "claimed", nil)
	h.call(22, "h1", wire.OpRenew, "j3", "a3", 1, 200) // before the later claim
	h.call(23, "h1", wire.OpRelease, "j3", "a3", 1, 204).event("j3", "a3", "released", nil)
	h.call(24, "h2", CallClaim, "j3", "a4", 2, 200).event("j3", "a4", "claimed", nil)
	h.call(24.05, "h1", wire.OpRenew, "j3", "a3", 1, 200) // sent before the claim's answer: not provably later
	h.call(25, "h1", wire.OpRelease, "j3", "a3", 1, 204)  // the repeat after a lost answer (P2)
	h.call(25.5, "h1", wire.OpRenew, "j3", "a3", 1, 409)  // refused: no violation
	h.call(26, "h2", wire.OpAdmission, "j3", "a4", 2, 200).event("j3", "a4", "admitted", nil)
	// a4's agent as its supervisor records it: its activation names the attempt.
	h.sv(26.5, "h2", "c1", RoleAgent, "i2.1", 103, ProcessStart).prompt(26.6, "h2", "c1", "j3")
	h.sv(27, "h2", "c1", RoleAgent, "i2.1", 103, ProcessExit)
	h.call(28, "h2", wire.OpSettlement, "j3", "a4", 2, 200).event("j3", "a4", "settled", nil)
	h.call(29, "h2", wire.OpFinish, "j3", "a4", 2, 200).event("j3", "a4", "finished", wire.FinishRequest{Outcome: wire.OutcomeSucceeded})
	h.job("c1", "j3", wire.JobSucceeded, wire.Attempt{ID: "a3", Generation: 1, LeaseOwner: "h1", ActivationID: "i1.4.secret3"},
		wire.Attempt{ID: "a4", Generation: 2, LeaseOwner: "h2", ActivationID: "i2.1.secret4"})
	h.fault(30, 31, "h1", "", FaultLatency, "")
	h.conv("c1", wire.ConversationUsable).conv("c2", wire.ConversationQuarantined)
	h.leftover("h1", "c1", RoleSupervisor, 201).leftover("h2", "c2", RoleSupervisor, 202)
	return h
}

// check writes the history, reads it back and checks it.
func (h *hist) check() (Report, []Record) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, r := range h.recs {
		if err := w.Write(r); err != nil {
			h.t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		h.t.Fatal(err)
	}
	recs, err := Read(&buf)
	if err != nil {
		h.t.Fatal(err)
	}
	return Check(recs), recs
}

func TestCleanHistoryIsClean(t *testing.T) {
	rep, _ := clean(t).check()
	if !rep.Clean() {
		t.Fatalf("a clean history has violations:\n%s", rep.Summary())
	}
	if rep.Totals.Turns != 3 || rep.Totals.JobStates[wire.JobSucceeded] != 3 || rep.Totals.Prompts != 3 || rep.Totals.Faults[FaultLatency] != 1 {
		t.Fatalf("totals %+v", rep.Totals)
	}
}

// only asserts that rep has exactly want findings, all of property p, each
// citing evidence lines that exist.
func only(t *testing.T, rep Report, recs []Record, p Property, want int) []Finding {
	t.Helper()
	var got []Finding
	for _, f := range rep.Findings {
		if f.Property != p {
			t.Errorf("unexpected finding %v", f)
			continue
		}
		got = append(got, f)
		if len(f.Lines) == 0 {
			t.Errorf("%v cites no evidence", f)
		}
		for _, n := range f.Lines {
			if n < 1 || n > len(recs) {
				t.Errorf("%v cites line %d of %d", f, n, len(recs))
			}
		}
	}
	if len(got) != want {
		t.Fatalf("%d findings of %s, want %d:\n%s", len(got), p, want, rep.Summary())
	}
	return got
}

// cites says f's evidence includes the line of the record that matches.
func cites(t *testing.T, f Finding, recs []Record, match func(Record) bool) {
	t.Helper()
	for _, n := range f.Lines {
		if match(recs[n-1]) {
			return
		}
	}
	t.Errorf("%v does not cite the record that shows it", f)
}

func TestTurnLost(t *testing.T) {
	h := clean(t)
	h.send(40, "c2", "j9")                                    // enqueued, never heard of again
	h.send(41, "c2", "j10").job("c2", "j10", wire.JobRunning) // still running at the end
	h.call(42, "h1", CallClaim, "j11", "a11", 1, 200)         // its send's answer was lost; a host claimed it
	rep, recs := h.check()
	fs := only(t, rep, recs, TurnLost, 3)
	if fs[0].Subject != "j9" || fs[1].Subject != "j10" || fs[2].Subject != "j11" {
		t.Fatalf("findings %v", fs)
	}
}

func TestPromptDeliveredTwice(t *testing.T) {
	h := clean(t)
	h.prompt(50, "h2", "c1", "j1") // j1's prompt replayed into a resumed session
	rep, recs := h.check()
	f := only(t, rep, recs, PromptTwice, 1)[0]
	if f.Subject != "j1" {
		t.Fatalf("finding %v", f)
	}
	cites(t, f, recs, func(r Record) bool { return r.Kind == KindPrompt && r.Time.Equal(h.at(50)) })
}

func TestPromptWithoutAdmission(t *testing.T) {
	h := clean(t)
	h.recs = slices.DeleteFunc(h.recs, func(r Record) bool {
		return r.JobID == "j2" && ((r.Event != nil && r.Event.Type == "admitted") || (r.HTTP != nil && r.HTTP.Call == wire.OpAdmission))
	})
	rep, recs := h.check()
	if f := only(t, rep, recs, PromptUnadmitted, 1)[0]; f.Subject != "j2" {
		t.Fatalf("finding %v", f)
	}
}

func TestStaleWriteAccepted(t *testing.T) {
	for _, call := range []string{wire.OpRenew, wire.OpEvents, wire.OpSettlement, wire.OpFinish} {
		t.Run(call, func(t *testing.T) {
			h := clean(t)
			h.call(25.2, "h1", call, "j3", "a3", 1, 200) // after a4's claim was answered
			rep, recs := h.check()
			f := only(t, rep, recs, StaleWrite, 1)[0]
			if f.Subject != "a3" || !strings.Contains(f.Detail, call) {
				t.Fatalf("finding %v", f)
			}
			cites(t, f, recs, func(r Record) bool { return r.HTTP != nil && r.HTTP.Call == CallClaim && r.AttemptID == "a4" })
		})
	}
}

// TestStaleWriteBorderlines: what the fence allows is no violation.
func TestStaleWriteBorderlines(t *testing.T) {
	tests := []struct {
		name string
		add  func(h *hist)
	}{
		{"a refused 409 to the stale attempt", func(h *hist) { h.call(25.3, "h1", wire.OpFinish, "j3", "a3", 1, 409) }},
		{"a 2xx before the later claim", func(h *hist) { h.call(23.5, "h1", wire.OpEvents, "j3", "a3", 1, 200) }},
		{"a 2xx sent while the later claim was in flight", func(h *hist) { h.call(24.02, "h1", wire.OpEvents, "j3", "a3", 1, 200) }},
		{"the later attempt's own writes", func(h *hist) { h.call(28.5, "h2", wire.OpRenew, "j3", "a4", 2, 200) }},
		{"a repeated release the store's events order before the claim", func(h *hist) {
			// Its first answer never reached the recorder; the store's
			// events show the release before a4's claim.
			h.recs = slices.DeleteFunc(h.recs, func(r Record) bool {
				return r.HTTP != nil && r.HTTP.Call == wire.OpRelease && r.HTTP.Sent.Equal(h.at(23))
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := clean(t)
			tt.add(h)
			if rep, _ := h.check(); !rep.Clean() {
				t.Fatalf("violations:\n%s", rep.Summary())
			}
		})
	}
	t.Run("a repeated release with no record of the first", func(t *testing.T) {
		h := clean(t)
		h.recs = slices.DeleteFunc(h.recs, func(r Record) bool {
			return (r.HTTP != nil && r.HTTP.Call == wire.OpRelease && r.HTTP.Sent.Equal(h.at(23))) ||
				(r.Event != nil && r.Event.Type == "released")
		})
		rep, recs := h.check()
		only(t, rep, recs, StaleWrite, 1)
	})
}

func TestOverlappingExecutions(t *testing.T) {
	t.Run("the old agent exits after the new one starts", func(t *testing.T) {
		h := clean(t)
		h.agent(24.5, "h1", "j3", "a3", 301, ProcessStart).agent(26.8, "h1", "j3", "a3", 301, ProcessExit)
		rep, recs := h.check()
		if f := only(t, rep, recs, Overlap, 1)[0]; f.Subject != "j3" || len(f.Lines) != 4 {
			t.Fatalf("finding %v", f)
		}
	})
	t.Run("the old agent's exit is never recorded", func(t *testing.T) {
		h := clean(t)
		h.agent(24.5, "h1", "j3", "a3", 301, ProcessStart)
		rep, recs := h.check()
		if f := only(t, rep, recs, Overlap, 1)[0]; !strings.Contains(f.Detail, "never recorded") {
			t.Fatalf("finding %v", f)
		}
	})
	t.Run("the old agent died with its host before the new one started", func(t *testing.T) {
		h := clean(t)
		h.agent(24.5, "h1", "j3", "a3", 301, ProcessStart).fault(25, 40, "h1", "", FaultKill, RoleHost)
		if rep, _ := h.check(); !rep.Clean() {
			t.Fatalf("violations:\n%s", rep.Summary())
		}
	})
	t.Run("the old agent exited before the new one started", func(t *testing.T) {
		h := clean(t)
		h.agent(24.5, "h1", "j3", "a3", 301, ProcessStart).agent(26.4, "h1", "j3", "a3", 301, ProcessExit)
		if rep, _ := h.check(); !rep.Clean() {
			t.Fatalf("violations:\n%s", rep.Summary())
		}
	})
}

// TestOverlapOfSupervisorRecords: the agents' starts and exits as their
// supervisors record them are tied to attempts by their
// activation, and two executions of one turn that overlap are found — a
// lines agent each, or an ACP agent's turn (its prompt sent to its answer)
// against a lines agent — and none is found where they do not.
func TestOverlapOfSupervisorRecords(t *testing.T) {
	for _, role := range []string{RoleAgent, RoleAgentTurn} {
		t.Run(role+": two executions of one turn overlap", func(t *testing.T) {
			h := clean(t)
			h.sv(24.5, "h1", "c1", role, "i1.4", 301, ProcessStart).sv(26.8, "h1", "c1", role, "i1.4", 301, ProcessExit)
			rep, recs := h.check()
			f := only(t, rep, recs, Overlap, 1)[0]
			if f.Subject != "j3" || !strings.Contains(f.Detail, "a3") || !strings.Contains(f.Detail, "a4") {
				t.Fatalf("finding %v", f)
			}
			cites(t, f, recs, func(r Record) bool { return r.Process != nil && r.Process.Activation == "i1.4" })
			if rep.Totals.AgentsRan != 4 || rep.Totals.AgentsJudged != 4 {
				t.Fatalf("totals %+v", rep.Totals)
			}
		})
		t.Run(role+": none overlaps", func(t *testing.T) {
			h := clean(t)
			h.sv(24.5, "h1", "c1", role, "i1.4", 301, ProcessStart).sv(26.4, "h1", "c1", role, "i1.4", 301, ProcessExit)
			rep, _ := h.check()
			if !rep.Clean() || rep.Totals.AgentsRan != 4 || rep.Totals.AgentsJudged != 4 {
				t.Fatalf("totals %+v, violations:\n%s", rep.Totals, rep.Summary())
			}
		})
	}
	t.Run("the agent died with its killed supervisor", func(t *testing.T) {
		h := clean(t)
		h.sv(24.5, "h1", "c1", RoleAgent, "i1.4", 301, ProcessStart).fault(25, 25.1, "h1", "c1", FaultKill, RoleSupervisor)
		if rep, _ := h.check(); !rep.Clean() {
			t.Fatalf("violations:\n%s", rep.Summary())
		}
	})
	t.Run("another conversation's supervisor was killed", func(t *testing.T) {
		h := clean(t)
		h.sv(24.5, "h1", "c1", RoleAgent, "i1.4", 301, ProcessStart).fault(25, 25.1, "h1", "c2", FaultKill, RoleSupervisor)
		rep, recs := h.check()
		if f := only(t, rep, recs, Overlap, 1)[0]; !strings.Contains(f.Detail, "never recorded") {
			t.Fatalf("finding %v", f)
		}
	})
}

// TestEveryAgentIsJudged: the checker counts the agents that ran against
// those it judged for overlap, and a gap is a violation: an attempt whose
// agent reported turn.started, or a job whose prompt reached an agent,
// with no start recorded; a start that names no attempt.
func TestEveryAgentIsJudged(t *testing.T) {
	rep, _ := clean(t).check()
	if rep.Totals.AgentsRan != 3 || rep.Totals.AgentsJudged != 3 || rep.Count(Unjudged) != 0 {
		t.Fatalf("a clean history: totals %+v", rep.Totals)
	}
	if md := rep.Markdown(Run{}); !strings.Contains(md, "| agents that ran (lines: processes; ACP: turns) | 3 |") ||
		!strings.Contains(md, "| of them judged for overlap | 3 |") {
		t.Fatalf("the table lacks the agents' counts:\n%s", md)
	}
	t.Run("an agent's turn.started with no start recorded", func(t *testing.T) {
		h := clean(t)
		h.events["j3"]++
		h.add(Record{JobID: "j3", Time: h.at(24.6), Event: &wire.JobEvent{ID: h.events["j3"], JobID: "j3", AttemptID: "a3", Source: "runner", Type: "turn.started"}})
		rep, recs := h.check()
		if f := only(t, rep, recs, Unjudged, 1)[0]; f.Subject != "a3" {
			t.Fatalf("finding %v", f)
		}
		if rep.Totals.AgentsRan != 4 || rep.Totals.AgentsJudged != 3 {
			t.Fatalf("totals %+v", rep.Totals)
		}
	})
	t.Run("a prompt received with no agent start recorded", func(t *testing.T) {
		h := clean(t)
		h.recs = slices.DeleteFunc(h.recs, func(r Record) bool { return r.Process != nil && r.Process.Activation == "i2.1" })
		rep, recs := h.check()
		f := only(t, rep, recs, Unjudged, 1)[0]
		if f.Subject != "j3" {
			t.Fatalf("finding %v", f)
		}
		cites(t, f, recs, func(r Record) bool { return r.Prompt != nil })
		if rep.Totals.AgentsRan != 3 || rep.Totals.AgentsJudged != 2 {
			t.Fatalf("totals %+v", rep.Totals)
		}
	})
	t.Run("a start whose activation names no attempt", func(t *testing.T) {
		h := clean(t)
		h.sv(40, "h1", "c1", RoleAgent, "i9.9", 309, ProcessStart).sv(41, "h1", "c1", RoleAgent, "i9.9", 309, ProcessExit)
		rep, recs := h.check()
		only(t, rep, recs, Unjudged, 1)
		if rep.Totals.AgentsRan != 4 || rep.Totals.AgentsJudged != 3 {
			t.Fatalf("totals %+v", rep.Totals)
		}
	})
}

func TestLeaks(t *testing.T) {
	h := clean(t)
	h.leftover("h1", "", RoleChild, 401)            // a turn child after every turn ended
	h.leftover("h2", "c1", RoleSupervisor, 402)     // a second supervisor of c1
	h.leftover("h2", "nobody", RoleSupervisor, 403) // of no known conversation
	h.conv("c3", wire.ConversationLost).leftover("h2", "c3", RoleSupervisor, 404)
	h.send(60, "c3", "j30").job("c3", "j30", wire.JobFailed) // c3 needs a cause; its LOST is counted apart
	h.leftover("h1", "c1", RoleAgent, 405)                   // a lines agent after its turn
	// An ACP conversation's one agent is kept by its supervisor; a second
	// one is a leak.
	h.add(Record{Time: h.at(1000), Conversation: &wire.Conversation{ID: "c4", State: wire.ConversationUsable, AgentProtocol: wire.AgentProtocolACP}})
	h.leftover("h1", "c4", RoleAgent, 406).leftover("h1", "c4", RoleAgent, 407)
	rep, _ := h.check()
	if n := rep.Count(Leak); n != 6 {
		t.Fatalf("%d leaks, want 6:\n%s", n, rep.Summary())
	}
}

func TestEndedWithoutPositiveRecord(t *testing.T) {
	h := clean(t)
	// j20 succeeded with a finish but no settlement; j21 failed with
	// nothing at all; j22 was cancelled with no cancel.
	h.send(70, "c2", "j20").call(71, "h2", CallClaim, "j20", "a20", 1, 200).event("j20", "a20", "claimed", nil)
	h.call(72, "h2", wire.OpFinish, "j20", "a20", 1, 200).job("c2", "j20", wire.JobSucceeded)
	h.send(73, "c2", "j21").job("c2", "j21", wire.JobFailed)
	h.send(74, "c2", "j22").event("j22", "a22", "finished", nil).job("c2", "j22", wire.JobCancelled)
	// j23 was superseded and requeued, and no later record ended it.
	h.send(75, "c2", "j23").event("j23", "a23", "claimed", nil).event("j23", "a23", "attempt_superseded", nil).
		event("j23", "a23", "requeued", nil).job("c2", "j23", wire.JobFailed)
	rep, recs := h.check()
	fs := only(t, rep, recs, Unexplained, 4)
	var got []string
	for _, f := range fs {
		got = append(got, f.Subject)
	}
	if !slices.Equal(got, []string{"j20", "j21", "j22", "j23"}) {
		t.Fatalf("findings for %v", got)
	}
}

// lostTurn adds an admitted turn of conversation c4 on host h3 that ended
// with a report losing the conversation, before any other record.
func lostTurn(h *hist, admissions []int, req wire.FinishRequest) *hist {
	h.send(80, "c4", "j40").call(81, "h3", CallClaim, "j40", "a40", 1, 200).event("j40", "a40", "claimed", nil)
	for i, status := range admissions {
		h.call(82+float64(i), "h3", wire.OpAdmission, "j40", "a40", 1, status)
	}
	req.AttemptRef = wire.AttemptRef{AttemptID: "a40", LeaseGeneration: 1}
	h.call(90, "h3", wire.OpFinish, "j40", "a40", 1, 200).event("j40", "a40", "finished", req)
	return h.job("c4", "j40", wire.JobFailed).conv("c4", wire.ConversationLost)
}

func TestLostConversations(t *testing.T) {
	ambiguous := wire.FinishRequest{Outcome: wire.OutcomeFailed, Class: "admission_ambiguous", Ambiguous: true}
	unrecoverable := wire.FinishRequest{Outcome: wire.OutcomeFailed, Class: "workspace_lost", Unrecoverable: true}
	tests := []struct {
		name  string
		build func(h *hist)
		want  Property
	}{
		{"R30: every admission answer lost", func(h *hist) { lostTurn(h, []int{0, 0, 0}, ambiguous) }, LostJustified},
		{"the last report lost it, not an earlier cancel that kept it usable", func(h *hist) {
			// seed 741987723: a turn cancelled before an unsure admission
			// says admission_ambiguous (the conversation stays usable); a
			// later turn's retained_receipt_mismatch lost it.
			h.send(60, "c4", "j39").call(61, "h3", CallClaim, "j39", "a39", 1, 200).event("j39", "a39", "claimed", nil)
			h.call(61.5, "", CallCancelJob, "j39", "", 0, 202)
			h.call(62, "h3", wire.OpAdmission, "j39", "a39", 1, 0)
			h.event("j39", "a39", "finished", wire.FinishRequest{AttemptRef: wire.AttemptRef{AttemptID: "a39", LeaseGeneration: 1},
				Outcome: wire.OutcomeCancelled, Class: "cancelled", Ambiguous: true})
			h.job("c4", "j39", wire.JobCancelled)
			lostTurn(h, []int{200}, wire.FinishRequest{Outcome: wire.OutcomeFailed, Class: "retained_receipt_mismatch", Unrecoverable: true})
		}, LostAvoidable},
		{"R30: one withheld, two refused by 503", func(h *hist) {
			lostTurn(h, []int{200, 503, 503}, ambiguous)
			for i := range h.recs {
				if r := &h.recs[i]; r.HTTP != nil && r.HTTP.Call == wire.OpAdmission && r.HTTP.Status == 200 {
					r.HTTP.Withheld = true
				}
			}
		}, LostJustified},
		{"R30: no try reached the recorder through a partition", func(h *hist) {
			lostTurn(h, nil, ambiguous).fault(81.5, 95, "h3", "", FaultPartition, "")
		}, LostJustified},
		{"R30: answered 2xx while the host's link lost data", func(h *hist) {
			lostTurn(h, []int{200, 200, 200}, ambiguous).fault(83.5, 84.2, "h3", "", FaultLoss, "")
		}, LostJustified},
		{"R30: answered 2xx while the host's turn child was stopped", func(h *hist) {
			lostTurn(h, []int{200, 200, 200}, ambiguous).fault(81.5, 82.5, "h3", "", FaultStop, RoleChild)
		}, LostJustified},
		{"ambiguous, with every try answered 2xx on a clean path", func(h *hist) {
			lostTurn(h, []int{200, 200, 200}, ambiguous).fault(83.5, 84.2, "h1", "", FaultLoss, "")
		}, LostAvoidable},
		{"ambiguous, but the host went on to settle", func(h *hist) {
			lostTurn(h, []int{0, 200}, ambiguous).call(86, "h3", wire.OpSettlement, "j40", "a40", 1, 409)
		}, LostAvoidable},
		{"ambiguous, but the job's prompt reached the agent", func(h *hist) {
			lostTurn(h, []int{0, 200}, ambiguous).agent(84.9, "h3", "j40", "a40", 140, ProcessStart).
				prompt(85, "h3", "c4", "j40").agent(85.5, "h3", "j40", "a40", 140, ProcessExit)
		}, LostAvoidable},
		{"ambiguous, with no record of a lost answer", func(h *hist) { lostTurn(h, nil, ambiguous) }, LostAvoidable},
		{"ambiguous, and the partition was on another host", func(h *hist) {
			lostTurn(h, nil, ambiguous).fault(81.5, 95, "h1", "", FaultPartition, "")
		}, LostAvoidable},
		{"R31: the sandbox was removed", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).fault(85, 85, "h3", "c4", FaultSandboxRemoved, RoleSandbox)
		}, LostJustified},
		{"K13: the supervisor was killed", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).fault(85, 86, "h3", "", FaultKill, RoleSupervisor)
		}, LostJustified},
		{"K13: the supervisor died by a signal", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).add(Record{Time: h.at(85), Host: "h3", ConversationID: "c4",
				Process: &Process{Role: RoleSupervisor, Event: ProcessExit, PID: 9, Signal: "KILL"}})
		}, LostJustified},
		{"unrecoverable, and the supervisor was only stopped", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).fault(85, 86, "h3", "c4", FaultStop, RoleSupervisor)
		}, LostAvoidable},
		{"unrecoverable, and another conversation's supervisor was killed", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).fault(85, 86, "h3", "c1", FaultKill, RoleSupervisor)
		}, LostAvoidable},
		{"unrecoverable, and the sandbox was damaged only after the report", func(h *hist) {
			lostTurn(h, []int{200}, unrecoverable).fault(95, 96, "h3", "c4", FaultSandboxRemoved, RoleSandbox)
		}, LostAvoidable},
		{"unrecoverable with no record of damage", func(h *hist) { lostTurn(h, []int{200}, unrecoverable) }, LostAvoidable},
		{"unrecoverable with a class that says nothing of the sandbox", func(h *hist) {
			lostTurn(h, []int{200}, wire.FinishRequest{Outcome: wire.OutcomeFailed, Class: "agent_exit", Unrecoverable: true}).
				fault(85, 85, "h3", "c4", FaultSandboxRemoved, RoleSandbox)
		}, LostAvoidable},
		{"lost with no report that says so", func(h *hist) {
			lostTurn(h, []int{200}, wire.FinishRequest{Outcome: wire.OutcomeFailed, Class: "agent_exit"})
		}, LostAvoidable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := clean(t)
			tt.build(h)
			rep, recs := h.check()
			f := only(t, rep, recs, tt.want, 1)[0]
			if f.Subject != "c4" {
				t.Fatalf("finding %v", f)
			}
			cites(t, f, recs, func(r Record) bool { return r.Conversation != nil && r.Conversation.ID == "c4" })
			if tt.want == LostJustified && !rep.Clean() {
				t.Fatalf("a justified LOST made the report unclean:\n%s", rep.Summary())
			}
		})
	}
}

func TestMarkdownSection(t *testing.T) {
	h := clean(t)
	h.call(25.2, "h1", wire.OpRenew, "j3", "a3", 1, 200)
	rep, _ := h.check()
	md := rep.Markdown(Run{Seed: 42, Turns: 3, Hosts: 3, Replicas: 2, Command: "make chaos SEED=42 TURNS=3"})
	for _, want := range []string{"Seed **42**", "| stale writes accepted | 1 |", "| turns lost (enqueued, never ended) | 0 |",
		"Fault mix: latency 1", "make chaos SEED=42 TURNS=3", "`stale_write_accepted` a3"} {
		if !strings.Contains(md, want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
	doc := []byte("# Title\n\nbefore\n" + SectionBegin("long") + "\nplaceholder\n" + SectionEnd("long") + "\nafter\n")
	once, err := ReplaceSection(doc, "long", md)
	if err != nil {
		t.Fatal(err)
	}
	twice, err := ReplaceSection(once, "long", md)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(once, twice) || bytes.Contains(once, []byte("placeholder")) || !bytes.HasSuffix(once, []byte(SectionEnd("long")+"\nafter\n")) {
		t.Fatalf("replacing the section twice:\n%s\n---\n%s", once, twice)
	}
	if _, err := ReplaceSection([]byte("no markers"), "long", md); err == nil {
		t.Fatal("a document without markers was accepted")
	}
}

// TestReliabilityDocHasTheLongRunSection: make chaos can write its table
// into docs/reliability.md.
func TestReliabilityDocHasTheLongRunSection(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "reliability.md"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReplaceSection(doc, LongRun, "a run"); err != nil {
		t.Fatal(err)
	}
}

// TestUncheckableRecordsAreCounted: a prompt that matches no job and an
// agent with no attempt escape the checks; the totals say how many.
func TestUncheckableRecordsAreCounted(t *testing.T) {
	h := clean(t)
	h.add(Record{Time: h.at(60), Host: "h1", ConversationID: "c1", Prompt: &Prompt{Text: "nobody sent this"}})
	h.add(Record{Time: h.at(61), Host: "h1", Process: &Process{Role: RoleAgent, Event: ProcessStart, PID: 77}})
	h.add(Record{Time: h.at(60), Host: "h1", ConversationID: "c1", Prompt: &Prompt{Text: "prompt of j1\n"}}) // j1's, again
	rep, _ := h.check()
	if rep.Count(PromptTwice) != 1 || rep.Count(Unjudged) != 1 || len(rep.Findings) != 2 {
		t.Fatalf("findings:\n%s", rep.Summary())
	}
	if rep.Totals.UnmatchedPrompts != 1 || rep.Totals.UnattributedAgents != 1 {
		t.Fatalf("totals %+v", rep.Totals)
	}
	if md := rep.Markdown(Run{}); !strings.Contains(md, "Not checked: 1 prompts received that match no job's, 1 agents with no attempt.") {
		t.Fatalf("the section does not say what was not checked:\n%s", md)
	}
}
