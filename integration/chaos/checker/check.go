package checker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Property is one promise the checker holds a history to; a Finding says
// where it was broken.
type Property string

// Properties, in the order of the report's table. Every one but
// LostJustified is a violation.
const (
	// TurnLost: a turn was enqueued (send_message answered 2xx, or a host
	// claimed it) and never ended: no final record, or one that is queued
	// or running.
	TurnLost Property = "turn_lost"
	// PromptTwice: one job's prompt reached an agent more than once — on
	// any host, in any session, a resumed one included (R25, R30, K13).
	PromptTwice Property = "prompt_delivered_twice"
	// PromptUnadmitted: a prompt reached an agent although its job has no
	// recorded admission (R25).
	PromptUnadmitted Property = "prompt_without_admission"
	// StaleWrite: an attempt-scoped write was answered 2xx although it
	// was sent after a later attempt of its job had been granted (P1).
	StaleWrite Property = "stale_write_accepted"
	// Overlap: agents of two attempts of one job ran at the same time (P3).
	Overlap Property = "overlapping_executions"
	// Unjudged: an agent (an ACP agent's turn) ran and the overlap check
	// could not judge it: no start of it was recorded (its attempt's
	// turn.started event or its prompt in a transcript shows it ran), or
	// its start names no attempt. Every agent must be judged.
	Unjudged Property = "agents_not_judged"
	// Leak: a process or sandbox left at the end that nothing retains.
	Leak Property = "leaked"
	// Unexplained: a job in a terminal state with no record of what ended
	// it: a report, the reaper, a cancel, its conversation lost — and, for
	// a success, a recorded settlement (K2, R18).
	Unexplained Property = "ended_without_record"
	// LostAvoidable: a conversation LOST without the evidence the rules
	// demand for it (R30, R31, K13).
	LostAvoidable Property = "lost_avoidable"
	// ReplicaOffline: a host went offline while a replica it lists was
	// killed or restarted, no other fault touching it.
	ReplicaOffline Property = "replica_loss_host_offline"
	// ReplicaLease: a host lost a lease while a replica it lists was
	// killed or restarted, no other fault touching it.
	ReplicaLease Property = "replica_loss_lease_lost"
	// LostJustified: a conversation LOST on the evidence the rules demand:
	// its admission answer lost on every try (R30), or its retained
	// sandbox or session gone or failing K13's verification. Not a
	// violation; counted and shown with its evidence.
	LostJustified Property = "lost_justified"
)

// properties are the rows of the report's table.
var properties = []struct {
	p     Property
	title string
}{
	{TurnLost, "turns lost (enqueued, never ended)"},
	{PromptTwice, "prompts delivered twice"},
	{PromptUnadmitted, "prompts delivered without an admission"},
	{StaleWrite, "stale writes accepted"},
	{Overlap, "overlapping executions of one job"},
	{Unjudged, "agents that ran, not judged for overlap"},
	{Leak, "processes or sandboxes leaked"},
	{Unexplained, "turns ended without a positive record"},
	{LostAvoidable, "conversations LOST, avoidable"},
	{ReplicaOffline, "hosts offline through a replica's kill or restart"},
	{ReplicaLease, "leases lost through a replica's kill or restart"},
	{LostJustified, "conversations LOST, justified (not a violation)"},
}

// Finding is one instance of a property, with the history lines that
// show it.
type Finding struct {
	Property Property
	Subject  string // the job, attempt, conversation or process it is about
	Detail   string // one sentence
	Lines    []int  // evidence: lines of the history
}

func (f Finding) String() string {
	return fmt.Sprintf("%s %s: %s (lines %v)", f.Property, f.Subject, f.Detail, f.Lines)
}

// Totals describe what the history holds, beside the findings.
type Totals struct {
	Records       int
	Requests      int
	Turns         int            // jobs the history knows
	JobStates     map[string]int // final job states
	Conversations map[string]int // final conversation states
	Prompts       int            // prompts the agents received
	// UnmatchedPrompts received matched no job's prompt, and agents had
	// no attempt: the checks of prompts and of overlaps cannot see them,
	// so the report shows how many there were.
	UnmatchedPrompts   int
	UnattributedAgents int
	// AgentsRan counts the agents (lines) and agent turns (ACP) that ran:
	// every recorded start, and every attempt or job that shows an agent
	// ran for it with no start recorded. AgentsJudged counts those the
	// overlap check judged (a start tied to an attempt). A gap is the
	// Unjudged finding.
	AgentsRan, AgentsJudged int
	Faults                  map[string]int // injected faults by kind
	// ReplicaLosses counts the replica kills and restarts, ReplicaJudged
	// the (loss, host) pairs the replica properties judged, and
	// ReplicaExcused the costs found there and set aside because another
	// fault that can cause them touched the host then.
	ReplicaLosses, ReplicaJudged, ReplicaExcused int
	// FailoverGaps are the judged renewal gaps across a replica's loss,
	// shortest first: from the last renewal answered through the lost
	// replica to the next one answered through another.
	FailoverGaps []time.Duration
	// SandboxesEvicted and SandboxesWoken count the daemons' records of
	// idle sandboxes stopped and started again (S1).
	SandboxesEvicted, SandboxesWoken int
}

// Report is what Check found: the totals and every finding.
type Report struct {
	Totals   Totals
	Findings []Finding
}

// Count is the number of findings of p.
func (r Report) Count(p Property) int {
	n := 0
	for _, f := range r.Findings {
		if f.Property == p {
			n++
		}
	}
	return n
}

// Violations are the findings that break a promise: all but the
// justified LOST conversations.
func (r Report) Violations() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Property != LostJustified {
			out = append(out, f)
		}
	}
	return out
}

// Clean says the history broke no promise.
func (r Report) Clean() bool { return len(r.Violations()) == 0 }

// history is the records indexed for the checks.
type history struct {
	recs  []Record
	end   time.Time // the last recorder time of the history
	jobs  map[string]*jobInfo
	convs map[string]*Record // final conversation records
	// attempts by id: the job and generation the claims and final jobs say.
	attempts map[string]attemptInfo
	writes   []*Record // attempt-scoped HTTP records
	prompts  []*Record
	procs    []*Record
	leftover []*Record
	faults   []*Record
	lose     map[string][]*Record // conversation → 2xx lose_conversation requests
	// unmatched counts the prompts received that matched no job (prompted).
	unmatched int
	// reached: the prompts received of each job (prompted).
	reached map[string][]*Record
	// agentsRan and agentsJudged are counted by unjudged.
	agentsRan, agentsJudged int
}

type jobInfo struct {
	id     string
	conv   string
	sent   *Record   // the 2xx send_message that enqueued it
	final  *Record   // KindJob
	events []*Record // KindEvent
	claims []*Record // 2xx claims of it
	http   []*Record // attempt-scoped calls and cancels about it
}

type attemptInfo struct {
	job        string
	generation int64
	host       string
	activation string  // the supervisor's activation id recorded at admission
	claim      *Record // the 2xx claim that granted it, when recorded
}

func index(recs []Record) *history {
	h := &history{
		recs: recs, jobs: map[string]*jobInfo{}, convs: map[string]*Record{},
		attempts: map[string]attemptInfo{}, lose: map[string][]*Record{}, reached: map[string][]*Record{},
	}
	job := func(id string) *jobInfo {
		j := h.jobs[id]
		if j == nil {
			j = &jobInfo{id: id}
			h.jobs[id] = j
		}
		return j
	}
	for i := range recs {
		r := &recs[i]
		if r.Time.After(h.end) {
			h.end = r.Time
		}
		switch r.Kind {
		case KindHTTP:
			if a := r.HTTP.Answered; a != nil && a.After(h.end) {
				h.end = *a
			}
			switch {
			case r.HTTP.Call == CallSendMessage && ok2xx(r.HTTP.Status) && r.JobID != "":
				j := job(r.JobID)
				j.sent, j.conv = r, first(j.conv, r.ConversationID)
			case r.HTTP.Call == CallClaim && r.HTTP.Status == http.StatusOK && r.JobID != "":
				j := job(r.JobID)
				j.claims = append(j.claims, r)
				if r.AttemptID != "" {
					a := h.attempts[r.AttemptID]
					a.job, a.generation, a.host = r.JobID, max(a.generation, r.LeaseGeneration), first(a.host, r.Host)
					if a.claim == nil {
						a.claim = r
					}
					h.attempts[r.AttemptID] = a
				}
			case IsAttemptWrite(r.HTTP.Call) && r.JobID != "":
				h.writes = append(h.writes, r)
				j := job(r.JobID)
				j.http = append(j.http, r)
			case r.HTTP.Call == CallCancelJob && r.JobID != "":
				j := job(r.JobID)
				j.http = append(j.http, r)
			case r.HTTP.Call == CallLoseConversation && ok2xx(r.HTTP.Status) && r.ConversationID != "":
				h.lose[r.ConversationID] = append(h.lose[r.ConversationID], r)
			}
		case KindJob:
			j := job(r.Job.ID)
			j.final, j.conv = r, first(j.conv, r.Job.ConversationID)
			for _, at := range r.Job.Attempts {
				a := h.attempts[at.ID]
				a.job, a.generation, a.host = r.Job.ID, first(a.generation, at.Generation), first(a.host, at.LeaseOwner)
				a.activation = first(a.activation, at.ActivationID)
				h.attempts[at.ID] = a
			}
			for k := range r.Job.Events {
				// Events the job record carries count as event records.
				ev := r.Job.Events[k]
				j.events = append(j.events, &Record{Kind: KindEvent, Line: r.Line, JobID: r.Job.ID, Event: &ev})
			}
		case KindEvent:
			id := first(r.Event.JobID, r.JobID)
			if id != "" {
				j := job(id)
				j.events = append(j.events, r)
			}
		case KindConversation:
			h.convs[r.Conversation.ID] = r
		case KindPrompt:
			h.prompts = append(h.prompts, r)
		case KindProcess:
			h.procs = append(h.procs, r)
		case KindLeftover:
			h.leftover = append(h.leftover, r)
		case KindFault:
			h.faults = append(h.faults, r)
			if e := r.Fault.End; e != nil && e.After(h.end) {
				h.end = *e
			}
		}
	}
	for _, j := range h.jobs {
		// One job's events, in the store's own order, without the
		// duplicates of a job record that carried them too.
		sort.SliceStable(j.events, func(a, b int) bool { return j.events[a].Event.ID < j.events[b].Event.ID })
		j.events = slices.CompactFunc(j.events, func(a, b *Record) bool { return a.Event.ID == b.Event.ID && a.Event.ID != 0 })
	}
	return h
}

// cmp is a if set, else b: the first thing a record said wins.
func first[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

func ok2xx(status int) bool { return status >= 200 && status < 300 }

// delivered2xx: the control plane accepted the request and its sender
// heard so.
func delivered2xx(h *HTTP) bool { return ok2xx(h.Status) && !h.Withheld }

// Check reads a history and reports every finding, in the order of the
// properties and then of the history.
func Check(recs []Record) Report {
	h := index(recs)
	var out []Finding
	out = append(out, h.turnsLost()...)
	out = append(out, h.prompted()...)
	out = append(out, h.staleWrites()...)
	out = append(out, h.overlaps()...)
	out = append(out, h.unjudged()...)
	out = append(out, h.leaks()...)
	out = append(out, h.unexplained()...)
	out = append(out, h.lost()...)
	var excused int
	out = append(out, h.replicaCosts(&excused)...)
	order := map[Property]int{}
	for i, p := range properties {
		order[p.p] = i
	}
	sort.SliceStable(out, func(a, b int) bool { return order[out[a].Property] < order[out[b].Property] })
	t := h.totals()
	t.ReplicaExcused = excused
	return Report{Totals: t, Findings: out}
}

func (h *history) totals() Totals {
	t := Totals{Records: len(h.recs), JobStates: map[string]int{}, Conversations: map[string]int{}, Faults: map[string]int{}}
	for _, r := range h.recs {
		if r.Kind == KindHTTP {
			t.Requests++
		}
	}
	for _, j := range h.jobs {
		t.Turns++
		if j.final != nil {
			t.JobStates[j.final.Job.State]++
		}
	}
	for _, c := range h.convs {
		t.Conversations[c.Conversation.State]++
	}
	t.Prompts = len(h.prompts)
	t.UnmatchedPrompts = h.unmatched
	for _, e := range h.executions() {
		if e.attempt == "" || e.job == "" {
			t.UnattributedAgents++
		}
	}
	t.AgentsRan, t.AgentsJudged = h.agentsRan, h.agentsJudged
	for _, f := range h.faults {
		t.Faults[f.Fault.Kind]++
		if replicaLoss(f) {
			t.ReplicaLosses++
		}
	}
	t.ReplicaJudged = len(h.replicaPairs())
	t.FailoverGaps = h.failoverGaps()
	t.SandboxesEvicted, t.SandboxesWoken = h.sandboxCounts()
	return t
}

func sortedJobs(h *history) []*jobInfo {
	js := make([]*jobInfo, 0, len(h.jobs))
	for _, j := range h.jobs {
		js = append(js, j)
	}
	sort.Slice(js, func(a, b int) bool { return firstLine(js[a]) < firstLine(js[b]) })
	return js
}

func firstLine(j *jobInfo) int {
	n := int(^uint(0) >> 1)
	for _, r := range []*Record{j.sent, j.final} {
		if r != nil {
			n = min(n, r.Line)
		}
	}
	for _, r := range j.claims {
		n = min(n, r.Line)
	}
	return n
}

func lines(rs ...*Record) []int {
	var out []int
	for _, r := range rs {
		if r != nil && r.Line > 0 && !slices.Contains(out, r.Line) {
			out = append(out, r.Line)
		}
	}
	slices.Sort(out)
	return out
}

// ---- turns lost ----

func ended(state string) bool {
	return state == wire.JobSucceeded || state == wire.JobFailed || state == wire.JobCancelled
}

func (h *history) turnsLost() []Finding {
	var out []Finding
	for _, j := range sortedJobs(h) {
		switch {
		case j.final == nil && j.sent != nil:
			out = append(out, Finding{TurnLost, j.id, "enqueued, and no final state was recorded", lines(j.sent)})
		case j.final == nil && len(j.claims) > 0:
			// Its send's answer never came, but a host claimed it.
			out = append(out, Finding{TurnLost, j.id, "claimed, and no final state was recorded", lines(j.claims[0])})
		case j.final != nil && !ended(j.final.Job.State):
			out = append(out, Finding{TurnLost, j.id, "still " + j.final.Job.State + " at the end", lines(j.sent, j.final)})
		}
	}
	return out
}

// ---- prompts ----

// prompted finds prompts delivered more often than their jobs sent them,
// and prompts of jobs that have no admission.
func (h *history) prompted() []Finding {
	type key struct{ conv, text string }
	// Prompts compare without the white space around them: the agent's
	// transcript has what arrived on its stdin.
	sentBy := map[key][]*jobInfo{}
	for _, j := range sortedJobs(h) {
		if j.final != nil && j.final.Job.Prompt != "" {
			k := key{j.conv, strings.TrimSpace(j.final.Job.Prompt)}
			sentBy[k] = append(sentBy[k], j)
		}
	}
	got := map[key][]*Record{}
	var order []key
	for _, p := range h.prompts {
		k := key{p.ConversationID, strings.TrimSpace(p.Prompt.Text)}
		if _, ok := sentBy[k]; !ok && k.conv == "" {
			// A transcript line without its conversation: find the job
			// by the text alone.
			for sk := range sentBy {
				if sk.text == k.text {
					k = sk
					break
				}
			}
		}
		if got[k] == nil {
			order = append(order, k)
		}
		got[k] = append(got[k], p)
	}
	var out []Finding
	for _, k := range order {
		ps, jobs := got[k], sentBy[k]
		if len(jobs) == 0 {
			h.unmatched += len(ps)
		}
		for _, j := range jobs {
			h.reached[j.id] = append(h.reached[j.id], ps...)
		}
		if len(ps) > max(1, len(jobs)) {
			subject := k.conv
			ev := lines(ps...)
			for _, j := range jobs {
				subject = j.id
				ev = append(ev, lines(j.final)...)
			}
			out = append(out, Finding{PromptTwice, subject,
				fmt.Sprintf("the prompt of %d job(s) reached an agent %d times", len(jobs), len(ps)), sortedUnique(ev)})
		}
		if len(jobs) != 1 {
			continue // not attributable to one job
		}
		j := jobs[0]
		if adm := admission(j); adm == nil {
			out = append(out, Finding{PromptUnadmitted, j.id, "its prompt reached an agent, and no admission of the job was recorded",
				lines(append(ps, j.final)...)})
		}
	}
	return out
}

func sortedUnique(ns []int) []int {
	slices.Sort(ns)
	return slices.Compact(ns)
}

// admission is the job's record of an admission: its "admitted" event or
// a 2xx admission answer.
func admission(j *jobInfo) *Record {
	for _, e := range j.events {
		if e.Event.Type == "admitted" {
			return e
		}
	}
	for _, r := range j.http {
		if r.HTTP.Call == wire.OpAdmission && ok2xx(r.HTTP.Status) {
			return r
		}
	}
	return nil
}

// ---- stale writes ----

// terminal calls end an attempt; the same report again gets the first
// answer (P2), so a repeat after a later claim is no stale write.
var terminal = map[string]string{wire.OpFinish: "finished", wire.OpAbandon: "abandoned", wire.OpRelease: "released"}

func (h *history) staleWrites() []Finding {
	var out []Finding
	for _, w := range h.writes {
		if !ok2xx(w.HTTP.Status) || w.AttemptID == "" {
			continue
		}
		j := h.jobs[w.JobID]
		gen := first(w.LeaseGeneration, h.attempts[w.AttemptID].generation)
		for _, c := range j.claims {
			if c.AttemptID == w.AttemptID || c.HTTP.Answered == nil || !w.HTTP.Sent.After(*c.HTTP.Answered) {
				continue // the same attempt, or not provably later
			}
			cgen := first(c.LeaseGeneration, h.attempts[c.AttemptID].generation)
			if !h.later(c, cgen, w.AttemptID, gen) {
				continue
			}
			if h.repeatedReport(j, w, c) {
				continue
			}
			out = append(out, Finding{StaleWrite, w.AttemptID,
				fmt.Sprintf("%s of generation %d answered %d, sent after generation %d (%s) was granted", w.HTTP.Call, gen, w.HTTP.Status, cgen, c.AttemptID),
				lines(w, c)})
			break
		}
	}
	return out
}

// later says the claim c (of generation cgen) granted a later attempt
// than att (of generation gen): by the generations when both are known,
// else by the claims' own times.
func (h *history) later(c *Record, cgen int64, att string, gen int64) bool {
	if gen != 0 && cgen != 0 {
		return cgen > gen
	}
	mine := h.attempts[att].claim
	return mine != nil && mine.HTTP.Answered != nil && c.HTTP.Sent.After(*mine.HTTP.Answered)
}

// repeatedReport says w is a terminal report its attempt had already had
// accepted before the later claim c: an earlier 2xx of the same call sent
// before c was answered, or the store's own event of it numbered before
// c's "claimed" event.
func (h *history) repeatedReport(j *jobInfo, w, c *Record) bool {
	ev, ok := terminal[w.HTTP.Call]
	if !ok {
		return false
	}
	for _, r := range j.http {
		if r != w && r.AttemptID == w.AttemptID && r.HTTP.Call == w.HTTP.Call && ok2xx(r.HTTP.Status) &&
			r.HTTP.Sent.Before(*c.HTTP.Answered) && r.Line < w.Line {
			return true
		}
	}
	var ended, claimed int64
	for _, e := range j.events {
		switch {
		case e.Event.Type == ev && e.Event.AttemptID == w.AttemptID && ended == 0:
			ended = e.Event.ID
		case e.Event.Type == "claimed" && e.Event.AttemptID == c.AttemptID && claimed == 0:
			claimed = e.Event.ID
		}
	}
	return ended != 0 && claimed != 0 && ended < claimed
}

// ---- overlapping executions ----

type execution struct {
	attempt, job, host, conv string
	start, end               time.Time
	open                     bool // no exit recorded: running to the end
	lines                    []int
}

// byActivation maps a supervisor's "instance.generation" to the attempt
// admitted under that activation (its id is instance.generation.secret).
func (h *history) byActivation() map[string]string {
	out := map[string]string{}
	for id, a := range h.attempts {
		if i := strings.LastIndexByte(a.activation, '.'); i > 0 {
			out[a.activation[:i]] = id
		}
	}
	return out
}

// executions pairs each agent's (or ACP agent turn's) start with its exit
// (same host, conversation, pid and activation), or with a kill of its
// whole host or of its supervisor (the agent dies with it: Pdeathsig);
// one with none of these runs to the end. A start the supervisor
// recorded names its attempt by its activation.
func (h *history) executions() []*execution {
	type key struct {
		host, conv, role string
		pid              int
		act, att         string
	}
	running := map[key]*execution{}
	var all []*execution
	kills := map[[2]string][]*Record{} // host, conversation ("" for the whole host)
	for _, f := range h.faults {
		switch {
		case f.Fault.Role == RoleHost && (f.Fault.Kind == FaultKill || f.Fault.Kind == FaultRestart):
			kills[[2]string{f.Host, ""}] = append(kills[[2]string{f.Host, ""}], f)
		case f.Fault.Role == RoleSupervisor && f.Fault.Kind == FaultKill && f.ConversationID != "":
			k := [2]string{f.Host, f.ConversationID}
			kills[k] = append(kills[k], f)
		}
	}
	acts := h.byActivation()
	for _, p := range h.procs {
		if p.Process.Role != RoleAgent && p.Process.Role != RoleAgentTurn {
			continue
		}
		k := key{p.Host, p.ConversationID, p.Process.Role, p.Process.PID, p.Process.Activation, p.AttemptID}
		if p.Process.PID != 0 {
			k.att = "" // the pid names it; the exit may not know its attempt
		}
		switch p.Process.Event {
		case ProcessStart:
			att := first(p.AttemptID, acts[p.Process.Activation])
			if p.Process.Activation == "" {
				att = p.AttemptID
			}
			e := &execution{attempt: att, job: p.JobID, host: p.Host, conv: p.ConversationID, start: p.Time, open: true, lines: []int{p.Line}}
			if e.job == "" {
				e.job = h.attempts[att].job
			}
			running[k] = e
			all = append(all, e)
		case ProcessExit:
			if e := running[k]; e != nil {
				e.end, e.open = p.Time, false
				e.lines = append(e.lines, p.Line)
				delete(running, k)
			}
		}
	}
	for _, e := range all {
		if !e.open {
			continue
		}
		for _, f := range append(slices.Clone(kills[[2]string{e.host, ""}]), kills[[2]string{e.host, e.conv}]...) {
			if f.Fault.Start.After(e.start) && (e.open || f.Fault.Start.Before(e.end)) {
				e.end, e.open = f.Fault.Start, false
				e.lines = append(e.lines, f.Line)
			}
		}
		if e.open {
			e.end = h.end
		}
	}
	return all
}

// unjudged counts the agents that ran and those the overlap check judged,
// and finds every one it could not judge: a start that names no attempt,
// an attempt whose turn.started event shows its agent ran with no start
// recorded, a job whose prompt reached an agent with no start recorded
// for any of its attempts.
func (h *history) unjudged() []Finding {
	var out []Finding
	judgedAtt, judgedJob := map[string]bool{}, map[string]bool{}
	h.agentsRan, h.agentsJudged = 0, 0
	for _, e := range h.executions() {
		h.agentsRan++
		if e.attempt == "" || e.job == "" {
			out = append(out, Finding{Unjudged, first(e.conv, e.host), "an agent's start names no attempt of a known job", e.lines[:1]})
			continue
		}
		h.agentsJudged++
		judgedAtt[e.attempt], judgedJob[e.job] = true, true
	}
	for _, j := range sortedJobs(h) {
		for _, ev := range j.events {
			att := ev.Event.AttemptID
			if ev.Event.Source != "runner" || ev.Event.Type != "turn.started" || att == "" || judgedAtt[att] {
				continue
			}
			judgedAtt[att], judgedJob[j.id] = true, true // counted once
			h.agentsRan++
			out = append(out, Finding{Unjudged, att, "its agent ran (turn.started) and no start of it was recorded", lines(ev)})
		}
		if ps := h.reached[j.id]; len(ps) > 0 && !judgedJob[j.id] {
			h.agentsRan++
			out = append(out, Finding{Unjudged, j.id, "its prompt reached an agent and no start of an agent of it was recorded", lines(ps...)})
		}
	}
	return out
}

func (h *history) overlaps() []Finding {
	byJob := map[string][]*execution{}
	var jobs []string
	for _, e := range h.executions() {
		if e.job == "" || e.attempt == "" {
			continue
		}
		if byJob[e.job] == nil {
			jobs = append(jobs, e.job)
		}
		byJob[e.job] = append(byJob[e.job], e)
	}
	var out []Finding
	for _, job := range jobs {
		es := byJob[job]
		for a := range es {
			for b := a + 1; b < len(es); b++ {
				x, y := es[a], es[b]
				if x.attempt == y.attempt || !x.start.Before(y.end) || !y.start.Before(x.end) {
					continue
				}
				why := fmt.Sprintf("agents of %s (on %s) and %s (on %s) ran at the same time", x.attempt, x.host, y.attempt, y.host)
				if x.open || y.open {
					why += "; an exit was never recorded"
				}
				out = append(out, Finding{Overlap, job, why, sortedUnique(append(slices.Clone(x.lines), y.lines...))})
			}
		}
	}
	return out
}

// ---- leaks ----

// leaks: every leftover is a leak but one supervisor and one sandbox of
// each conversation that is still usable or quarantined (retained for its
// next turn), and, of an ACP conversation, its one agent (its supervisor
// keeps it across turns, A1).
func (h *history) leaks() []Finding {
	type key struct{ conv, role string }
	kept := map[key]bool{}
	var out []Finding
	for _, r := range h.leftover {
		l := r.Leftover
		subject := fmt.Sprintf("%s %s on %s", l.Role, first(l.ContainerID, fmt.Sprint(l.PID)), r.Host)
		c := h.convs[r.ConversationID]
		retainable := l.Role == RoleSupervisor || l.Role == RoleSandbox ||
			l.Role == RoleAgent && c != nil && c.Conversation.AgentProtocol == wire.AgentProtocolACP
		switch {
		case !retainable:
			out = append(out, Finding{Leak, subject, "a " + l.Role + " still there at the end", lines(r)})
		case r.ConversationID == "" || c == nil:
			out = append(out, Finding{Leak, subject, "retained for no known conversation", lines(r)})
		case c.Conversation.State == wire.ConversationLost:
			out = append(out, Finding{Leak, subject, "retained for a LOST conversation (K8 removes it)", lines(r, c)})
		case kept[key{r.ConversationID, l.Role}]:
			out = append(out, Finding{Leak, subject, "a second " + l.Role + " of " + r.ConversationID, lines(r)})
		default:
			kept[key{r.ConversationID, l.Role}] = true
		}
	}
	return out
}

// ---- ended without a positive record ----

// endings are the control plane's events that end a job.
var endings = map[string]bool{
	"finished": true, "abandoned": true, "release_cap": true, "worker_lost_cap": true,
	"attempt_superseded": true, "cancelled": true, "failed": true, "released": true,
}

func (h *history) unexplained() []Finding {
	var out []Finding
	for _, j := range sortedJobs(h) {
		if j.final == nil || !ended(j.final.Job.State) {
			continue
		}
		state := j.final.Job.State
		// The last ending event after the job's last claim or requeue
		// ended it; a release ends a job only with its cancel.
		var end, settled, cancel *Record
		for _, e := range j.events {
			switch t := e.Event.Type; {
			case t == "claimed" || t == "requeued":
				end = nil
			case t == "released" && state != wire.JobCancelled:
			case endings[t]:
				end = e
			}
			switch e.Event.Type {
			case "settled":
				settled = first(settled, e)
			case "cancel_requested", "cancelled":
				cancel = first(cancel, e)
			}
		}
		for _, r := range j.http {
			switch c := r.HTTP.Call; {
			case !ok2xx(r.HTTP.Status):
			case (c == wire.OpFinish || c == wire.OpAbandon) && end == nil:
				end = r
			case c == wire.OpSettlement && settled == nil:
				settled = r
			case c == CallCancelJob && cancel == nil:
				cancel = r
			}
		}
		switch {
		case end == nil:
			out = append(out, Finding{Unexplained, j.id, state + " with no report, reaper, cancel or loss recorded", lines(j.sent, j.final)})
		case state == wire.JobSucceeded && settled == nil:
			out = append(out, Finding{Unexplained, j.id, "succeeded with no settlement recorded", lines(j.final, end)})
		case state == wire.JobCancelled && cancel == nil:
			out = append(out, Finding{Unexplained, j.id, "cancelled with no cancel recorded", lines(j.final, end)})
		}
	}
	return out
}

// ---- LOST conversations ----

// damages says the fault f can have destroyed the retained sandbox or
// session of conv, whose sandboxes were on hosts: its removal, or a kill
// or restart of its supervisor, its sandbox or its whole host. A stop
// (SIGSTOP … SIGCONT), a network fault or a kill of a turn child leaves the
// session as it was.
func damages(f *Record, conv string, hosts map[string]bool) bool {
	mine := f.ConversationID == conv || (f.ConversationID == "" && hosts[f.Host])
	switch f.Fault.Kind {
	case FaultSandboxRemoved:
		return mine
	case FaultKill, FaultRestart:
		switch f.Fault.Role {
		case RoleSupervisor, RoleSandbox:
			return mine
		case RoleHost:
			return hosts[f.Host]
		}
	}
	return false
}

// finishFacts is what a "finished" event says of its report: the
// FinishRequest the store kept.
type finishFacts struct {
	wire.FinishRequest
}

// sandboxClasses are the classes of a report that the retained sandbox or
// session is gone or not the settled one (R31, K13).
var sandboxClasses = map[string]bool{"workspace_lost": true, "container_replaced": true, "native_boundary_mismatch": true}

// networkFaults cut or stall a host's link to the control planes.
var networkFaults = map[string]bool{
	FaultTimeout: true, FaultReset: true, FaultLoss: true, FaultDropResponse: true, FaultPartition: true,
	FaultLatency: true, FaultBandwidth: true,
}

func (h *history) lost() []Finding {
	ids := make([]string, 0, len(h.convs))
	for id, c := range h.convs {
		if c.Conversation.State == wire.ConversationLost {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return h.convs[ids[a]].Line < h.convs[ids[b]].Line })
	var out []Finding
	for _, id := range ids {
		out = append(out, h.whyLost(id))
	}
	return out
}

// whyLost classifies one LOST conversation from positive records only: the
// report that lost it (a "finished" event saying admission_ambiguous or
// context_unrecoverable) and the evidence that report needs.
func (h *history) whyLost(conv string) Finding {
	c := h.convs[conv]
	avoidable := func(why string, rs ...*Record) Finding {
		return Finding{LostAvoidable, conv, why, lines(append(rs, c)...)}
	}
	// The last such report lost it: a LOST conversation runs no later
	// turn, and an earlier one did not lose it (a cancel before an
	// unsure admission says admission_ambiguous and keeps it usable).
	var cause *Record
	var facts finishFacts
	var j *jobInfo
	for _, cj := range sortedJobs(h) {
		if cj.conv != conv {
			continue
		}
		for _, e := range cj.events {
			var f finishFacts
			if e.Event.Type == "finished" && json.Unmarshal(e.Event.Data, &f) == nil && (f.Ambiguous || f.Unrecoverable) {
				cause, facts, j = e, f, cj
			}
		}
	}
	if cause == nil {
		if l := h.lose[conv]; len(l) > 0 {
			return avoidable("lost on an operator's word, not on the rules'", l[0])
		}
		return avoidable("no report recorded that it must be lost")
	}
	att := first(cause.Event.AttemptID, facts.AttemptID)
	if facts.Ambiguous {
		return h.ambiguous(conv, j, att, cause, c)
	}
	return h.unrecoverable(conv, j, att, facts, cause, c)
}

// ambiguous: R30 demands LOST when no admission answer reached the host
// and the admission may have committed. The recorder sits behind the fault
// proxy, so a 2xx it saw proves only that the replica answered, not that
// the host heard it. The LOST is justified when the host never acted on an
// admission (no prompt of the job delivered, no settlement or notice of the
// attempt) and the history shows what lost the answers: a try the replica
// never answered, answered with a 5xx or 408, or whose answer was withheld;
// or a fault on the path of the tries while they ran — a network fault on
// the host's link, a fault of the replica they went to, a stop of the
// host's turn child or daemon (its timers run on), PostgreSQL restarted.
// With no try recorded at all, a fault on the host's link over the
// attempt's life (its tries stalled before the recorder).
func (h *history) ambiguous(conv string, j *jobInfo, att string, cause, c *Record) Finding {
	var tries []*Record
	unsure := false
	replicas := map[string]bool{}
	for _, r := range j.http {
		switch {
		case r.AttemptID != att:
		case r.HTTP.Call == wire.OpSettlement || r.HTTP.Call == wire.OpNotices:
			return Finding{LostAvoidable, conv, "lost as an ambiguous admission, but the host went on to " + r.HTTP.Call + ", as only an admitted turn does",
				lines(r, cause, c)}
		case r.HTTP.Call == wire.OpAdmission:
			tries = append(tries, r)
			replicas[r.Replica] = true
			if r.HTTP.Status == 0 || r.HTTP.Withheld || r.HTTP.Status >= 500 || r.HTTP.Status == http.StatusRequestTimeout {
				unsure = true
			}
		}
	}
	if j.final != nil && j.final.Job.Prompt != "" {
		for _, p := range h.prompts {
			if p.ConversationID == conv && strings.TrimSpace(p.Prompt.Text) == strings.TrimSpace(j.final.Job.Prompt) {
				return Finding{LostAvoidable, conv, "lost as an ambiguous admission, but the job's prompt reached the agent",
					lines(p, cause, c)}
			}
		}
	}
	if unsure {
		return Finding{LostJustified, conv, fmt.Sprintf("R30: %d admission tries of %s, none answered to the host", len(tries), att),
			lines(append(tries, cause, c)...)}
	}
	a := h.attempts[att]
	var from, to time.Time
	switch {
	case len(tries) > 0:
		from, to = tries[0].HTTP.Sent, tries[len(tries)-1].HTTP.Sent
		if at := tries[len(tries)-1].HTTP.Answered; at != nil {
			to = *at
		}
	default:
		to = h.end
		if a.claim != nil {
			from = a.claim.HTTP.Sent
		}
		for _, r := range j.http {
			if r.AttemptID == att && terminal[r.HTTP.Call] != "" {
				to = r.HTTP.Sent
				break
			}
		}
	}
	for _, f := range h.faults {
		if !overlaps(f.Fault, from, to) || !onPath(f, a.host, replicas) {
			continue
		}
		what := f.Fault.Kind
		if f.Fault.Role != "" {
			what += " of a " + f.Fault.Role
		}
		return Finding{LostJustified, conv, fmt.Sprintf("R30: no admission answer of %s reached the host during %s", att, what),
			lines(append(tries, f, cause, c)...)}
	}
	return Finding{LostAvoidable, conv, fmt.Sprintf("lost as an ambiguous admission, with %d tries answered and nothing on their path that could lose the answers", len(tries)),
		lines(append(tries, cause, c)...)}
}

// onPath says the fault f can have delayed or cut the answers between
// the replicas (none known: any) and host.
func onPath(f *Record, host string, replicas map[string]bool) bool {
	toReplica := f.Replica == "" || len(replicas) == 0 || replicas[f.Replica]
	switch k := f.Fault.Kind; {
	case networkFaults[k]:
		return (f.Host == host && host != "" && toReplica) || (f.Host == "" && f.Replica != "" && toReplica)
	case k == FaultPGRestart:
		return true
	case k == FaultStop || k == FaultKill || k == FaultRestart:
		switch f.Fault.Role {
		case RoleReplica:
			return f.Replica != "" && toReplica
		case RoleChild, RoleDaemon, RoleHost:
			return f.Host == host && host != ""
		}
	}
	return false
}

func overlaps(f *Fault, from, to time.Time) bool {
	end := to
	if f.End != nil {
		end = *f.End
	}
	return f.Start.Before(to) && !end.Before(from)
}

// unrecoverable: R31 and K13 demand LOST when the retained sandbox or
// session is gone or fails verification; that needs a report saying so by
// its class and a record of what damaged the sandbox: a fault on the
// conversation's sandbox, a kill or restart of a supervisor, a sandbox or
// the whole host that held it, or its supervisor's death by a signal or
// a failure.
func (h *history) unrecoverable(conv string, j *jobInfo, att string, facts finishFacts, cause, c *Record) Finding {
	if !sandboxClasses[facts.Class] {
		return Finding{LostAvoidable, conv, fmt.Sprintf("lost as unrecoverable with class %q, which is no evidence about the sandbox", facts.Class),
			lines(cause, c)}
	}
	before := h.end
	for _, r := range j.http {
		if r.AttemptID == att && r.HTTP.Call == wire.OpFinish {
			before = r.HTTP.Sent
			break
		}
	}
	hosts := map[string]bool{}
	if c.Conversation.SandboxHost != "" {
		hosts[c.Conversation.SandboxHost] = true
	}
	for id, a := range h.attempts {
		if a.host != "" && (id == att || (h.jobs[a.job] != nil && h.jobs[a.job].conv == conv)) {
			hosts[a.host] = true
		}
	}
	for _, f := range h.faults {
		if !f.Fault.Start.Before(before) || !damages(f, conv, hosts) {
			continue
		}
		return Finding{LostJustified, conv, fmt.Sprintf("R31/K13: %s, after %s of %s", facts.Class, f.Fault.Kind, first(f.Fault.Role, "its sandbox")),
			lines(f, cause, c)}
	}
	for _, p := range h.procs {
		pr := p.Process
		if p.ConversationID != conv || p.Time.After(before) || pr.Event != ProcessExit ||
			(pr.Role != RoleSupervisor && pr.Role != RoleSandbox) {
			continue
		}
		if pr.Signal != "" || (pr.ExitCode != nil && *pr.ExitCode != 0) {
			return Finding{LostJustified, conv, fmt.Sprintf("R31/K13: %s, after its %s ended (%s)", facts.Class, pr.Role, first(pr.Signal, "failed")),
				lines(p, cause, c)}
		}
	}
	return Finding{LostAvoidable, conv, fmt.Sprintf("lost as unrecoverable (%s) with no record that its sandbox was damaged", facts.Class),
		lines(cause, c)}
}

// Summary is one line per property with its count, for a test's failure
// message.
func (r Report) Summary() string {
	var b strings.Builder
	for _, p := range properties {
		fmt.Fprintf(&b, "%s: %d\n", p.title, r.Count(p.p))
	}
	fmt.Fprintf(&b, "not checked: %d prompts matching no job, %d agents with no attempt\n", r.Totals.UnmatchedPrompts, r.Totals.UnattributedAgents)
	fmt.Fprintf(&b, "agents: %d ran, %d judged for overlap\n", r.Totals.AgentsRan, r.Totals.AgentsJudged)
	for _, f := range r.Violations() {
		fmt.Fprintf(&b, "  %v\n", f)
	}
	return b.String()
}
