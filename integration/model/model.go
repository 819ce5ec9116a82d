// Package model is a small, exhaustively checked model of runnerd's lease
// protocol: claim, renewal, the runner's local deadline (R10, K5), the
// reaper (P3), admission (R25, R30), release (R33, R36), settlement and the
// terminal report, with lost and late answers and a finish that arrives
// after its sender stopped. Check explores every interleaving of two hosts
// and one job up to a bound on time and generations, and reports the first
// state that breaks a safety property, with the steps that led to it.
//
// The model mirrors the rules, not the code: it is what the code must
// refine. Variant switches the model into a deliberately broken protocol
// (no generation fence, a release that ignores admission, no local
// deadline, …), so the tests show that the checker finds each violation it
// claims to rule out. Nothing of the product imports this package.
package model

import (
	"fmt"
	"strings"
)

// Variant names a protocol the checker explores: Correct, or one rule
// broken on purpose.
type Variant int

const (
	Correct Variant = iota
	// NoGenerationFence: the control plane applies a report whatever its
	// lease generation (P1 broken).
	NoGenerationFence
	// ReleaseIgnoresAdmission: a host releases a turn whose child went on
	// running (a wrong observation, K6), and the release statement does not
	// require that no membership admitted the job (R33 and R36 broken).
	ReleaseIgnoresAdmission
	// NoLocalDeadline: the runner keeps the turn going past the point where
	// its lease may have been superseded (R10 and K5 broken).
	NoLocalDeadline
	// DeadlineFromAnswer: the runner counts its lease from when a renewal's
	// answer arrived instead of when the request was sent (R10 broken).
	DeadlineFromAnswer
	// RequeueAdmitted: the reaper requeues an expired attempt even when its
	// job was admitted (R30 and K13 broken).
	RequeueAdmitted
)

var variantNames = [...]string{"Correct", "NoGenerationFence", "ReleaseIgnoresAdmission", "NoLocalDeadline", "DeadlineFromAnswer", "RequeueAdmitted"}

func (v Variant) String() string { return variantNames[v] }

// Bounds of the explored space. Times are whole ticks; a lease lasts
// LeaseTicks; the reaper waits GraceTicks past expiry.
const (
	LeaseTicks = 3
	GraceTicks = 1
	MaxTime    = 7
	MaxGen     = 3
	hosts      = 2
)

// Job states on the control plane.
const (
	jobQueued uint8 = iota
	jobRunning
	jobSucceeded
	jobFailed
)

// Host phases of the one attempt a host holds. A host runs at most one
// turn in this model.
const (
	idle      uint8 = iota
	claimed         // the claim answer arrived; the child has not accepted
	accepted        // the child accepted: preparation writes the workspace
	admitting       // the admission request was applied; its answer is awaited
	admitted        // the admission acknowledgement arrived
	running         // the prompt was handed to the agent
	settling        // the agent is done; settlement is owed
	reporting       // settled; the terminal report is owed
	failing         // the turn failed after acceptance; a failed report is owed
)

// executing says whether a host in this phase may write the shared
// workspace or drive the agent.
func executing(p uint8) bool { return p >= accepted && p <= settling }

// answer is an answer in flight to a host.
type answer uint8

const (
	none answer = iota
	granted
	refused
)

// host is one host daemon with its turn child, as far as the protocol
// goes.
type host struct {
	Phase    uint8
	Gen      uint8 // lease generation of the held attempt
	Deadline int8  // local lease deadline (R10), in ticks
	Renew    answer
	RenewAt  int8 // when the renewal in flight was sent
	Admit    answer
	// Finish is a terminal report sent and not yet arrived at the control
	// plane; it may arrive after the host moved on.
	Finish    bool
	FinishGen uint8
	FinishOK  bool // the report says succeeded (settled) rather than failed
}

// server is the control plane's record of the one job and its
// conversation.
type server struct {
	Job      uint8
	Gen      uint8 // generation of the live (or last) attempt
	Expiry   int8
	Admitted bool
	Settled  bool
	Lost     bool // the conversation is LOST (or quarantined, K13)
	Releases uint8
}

// State is one global state of the model; it is comparable, so that the
// checker can remember the states it has seen.
type State struct {
	Now       int8
	S         server
	H         [hosts]host
	Delivered uint8 // how many times an agent received the prompt
	// Stale is set when the control plane applied a write from an
	// attempt that is not the live one.
	Stale bool
}

// Violation is a broken safety property with the steps that reach it.
type Violation struct {
	Property string
	Trace    []string
	State    State
}

func (v *Violation) Error() string {
	return fmt.Sprintf("%s after %d steps:\n  %s", v.Property, len(v.Trace), strings.Join(v.Trace, "\n  "))
}

// Result is what a check explored. The Reached counts show that the
// bounds leave room for the histories that matter.
type Result struct {
	States    int
	Violation *Violation
	// ReachedMaxGen counts states whose job was claimed MaxGen times;
	// Succeeded and Quarantined count states whose job succeeded, or whose
	// conversation was quarantined.
	ReachedMaxGen, Succeeded, Quarantined int
}

// safety returns the name of the first property s breaks, or "".
func safety(s State) string {
	switch {
	case s.Delivered > 1:
		return "prompt delivered twice"
	case s.Stale:
		return "stale write accepted"
	}
	n := 0
	for _, h := range s.H {
		if executing(h.Phase) {
			n++
		}
		// R10's argument: counted from the send, a host's deadline for the
		// live attempt never falls after the control plane's expiry.
		if h.Phase != idle && h.Gen == s.S.Gen && s.S.Job == jobRunning && h.Deadline > s.S.Expiry {
			return "local deadline after the server's expiry"
		}
	}
	if n > 1 {
		return "overlapping executions of one job"
	}
	return ""
}

// Check explores every state reachable under v breadth first, so a
// violation comes with one of its shortest traces.
func Check(v Variant) Result {
	type node struct {
		parent int
		step   string
		s      State
	}
	start := State{S: server{Job: jobQueued}}
	seen := map[State]bool{start: true}
	nodes := []node{{parent: -1, s: start}}
	var res Result
	for i := 0; i < len(nodes); i++ {
		cur := nodes[i].s
		for _, n := range successors(v, cur) {
			if seen[n.s] {
				continue
			}
			seen[n.s] = true
			nodes = append(nodes, node{parent: i, step: n.step, s: n.s})
			res.count(n.s)
			if p := safety(n.s); p != "" {
				var trace []string
				for j := len(nodes) - 1; j > 0; j = nodes[j].parent {
					trace = append(trace, nodes[j].step)
				}
				for a, b := 0, len(trace)-1; a < b; a, b = a+1, b-1 {
					trace[a], trace[b] = trace[b], trace[a]
				}
				res.States, res.Violation = len(nodes), &Violation{Property: p, Trace: trace, State: n.s}
				return res
			}
		}
	}
	res.States = len(nodes)
	return res
}

func (r *Result) count(s State) {
	if s.S.Gen == MaxGen {
		r.ReachedMaxGen++
	}
	if s.S.Job == jobSucceeded {
		r.Succeeded++
	}
	if s.S.Lost {
		r.Quarantined++
	}
}

type next struct {
	step string
	s    State
}

// successors lists every step the model can take from s.
func successors(v Variant, s State) []next {
	var out []next
	add := func(step string, n State) { out = append(out, next{step, n}) }

	// Time passes, unless a host holds a turn past its local deadline: the
	// runner's own timer stops it first (R10, K5).
	if s.Now < MaxTime && (v == NoLocalDeadline || !overdue(s)) {
		n := s
		n.Now++
		add(fmt.Sprintf("t=%d", n.Now), n)
	}
	// The reaper supersedes an attempt whose lease ended more than the
	// grace ago (P3).
	if s.S.Job == jobRunning && s.Now > s.S.Expiry+GraceTicks {
		n := s
		switch {
		case !s.S.Admitted || v == RequeueAdmitted:
			n.S.Job = jobQueued // never admitted: requeued (R30)
		default:
			n.S.Job, n.S.Lost = jobFailed, true // admitted: quarantined, never replayed (K13)
		}
		add(fmt.Sprintf("reaper supersedes gen %d", s.S.Gen), n)
	}
	for i := range s.H {
		hostSteps(v, s, i, add)
	}
	return out
}

func overdue(s State) bool {
	for _, h := range s.H {
		if h.Phase != idle && s.Now >= h.Deadline {
			return true
		}
	}
	return false
}

// live says whether a write of generation gen is the live attempt's, as the
// control plane's guarded statements require (P1); under NoGenerationFence
// every write is applied and a stale one is remembered.
func live(v Variant, n *State, gen uint8) bool {
	ok := n.S.Job == jobRunning && n.S.Gen == gen
	if !ok && v == NoGenerationFence && gen != 0 {
		n.Stale = true
		return true
	}
	return ok
}

func hostSteps(v Variant, s State, i int, add func(string, State)) {
	h := s.H[i]
	name := func(what string) string { return fmt.Sprintf("host %d %s", i, what) }
	with := func(f func(n *State, h *host)) State {
		n := s
		f(&n, &n.H[i])
		return n
	}

	// A late terminal report arrives at the control plane whatever the
	// host does meanwhile.
	if h.Finish {
		add(name(fmt.Sprintf("finish of gen %d arrives", h.FinishGen)), with(func(n *State, h *host) {
			h.Finish = false
			if live(v, n, h.FinishGen) {
				switch {
				case h.FinishOK:
					n.S.Job = jobSucceeded
				case n.S.Admitted && !n.S.Settled:
					n.S.Job, n.S.Lost = jobFailed, true // admitted, unsettled: quarantined (K13)
				default:
					n.S.Job = jobFailed
				}
			}
		}))
	}

	if h.Phase == idle {
		if s.S.Job == jobQueued && s.S.Gen < MaxGen {
			claim := func(n *State) {
				n.S.Gen++
				n.S.Job, n.S.Expiry, n.S.Settled = jobRunning, n.Now+LeaseTicks, false
			}
			add(name("claims"), with(func(n *State, h *host) {
				claim(n)
				// The claim counts as the first renewal, sent now (R10).
				*h = host{Phase: claimed, Gen: n.S.Gen, Deadline: n.Now + LeaseTicks, Finish: h.Finish, FinishGen: h.FinishGen, FinishOK: h.FinishOK}
			}))
			add(name("claims, the answer is lost"), with(func(n *State, _ *host) { claim(n) }))
		}
		return
	}

	// Past its local deadline a host stops the turn and writes nothing more
	// about the attempt (R10, K5).
	if v != NoLocalDeadline && s.Now >= h.Deadline {
		add(name("stops the turn at its deadline"), with(func(_ *State, h *host) { h.Phase = idle }))
	}

	// Renewal runs beside the turn, whatever its phase (R2, R9).
	switch h.Renew {
	case none:
		add(name("renews"), with(func(n *State, h *host) {
			h.Renew, h.RenewAt = refused, n.Now
			if n.S.Job == jobRunning && n.S.Gen == h.Gen {
				n.S.Expiry, h.Renew = n.Now+LeaseTicks, granted
			}
		}))
	default:
		add(name("loses a renewal answer"), with(func(_ *State, h *host) { h.Renew = none }))
		add(name("hears its renewal answer"), with(func(n *State, h *host) {
			if h.Renew == refused {
				h.Phase, h.Renew = idle, none // 409: stop, write nothing (R8)
				return
			}
			from := h.RenewAt
			if v == DeadlineFromAnswer {
				from = n.Now
			}
			h.Deadline, h.Renew = max(h.Deadline, from+LeaseTicks), none
		}))
	}

	switch h.Phase {
	case claimed:
		add(name("child accepts"), with(func(_ *State, h *host) { h.Phase = accepted }))
		// The child closed its descriptor without accepting (R33).
		add(name("releases a never-accepted turn"), with(func(n *State, h *host) {
			release(v, n, h)
			h.Phase = idle
		}))
	case accepted:
		add(name("asks for admission"), with(func(n *State, h *host) {
			h.Phase, h.Admit = admitting, refused
			if live(v, n, h.Gen) {
				n.S.Admitted, h.Admit = true, granted
			}
		}))
		add(name("fails preparation"), with(func(_ *State, h *host) { h.Phase = failing }))
	case admitting:
		add(name("loses the admission answer"), with(func(_ *State, h *host) { h.Phase = failing })) // never replayed (R30)
		add(name("hears the admission answer"), with(func(_ *State, h *host) {
			if h.Admit == granted {
				h.Phase = admitted
			} else {
				h.Phase = failing
			}
		}))
	case admitted:
		add(name("hands the prompt to the agent"), with(func(n *State, h *host) {
			h.Phase = running
			n.Delivered++
		}))
	case running:
		add(name("agent finishes"), with(func(_ *State, h *host) { h.Phase = settling }))
		if v == ReleaseIgnoresAdmission {
			add(name("releases a turn it wrongly thinks never started"), with(func(n *State, h *host) {
				release(v, n, h)
				h.Phase = idle
			}))
		}
	case settling:
		add(name("settles"), with(func(n *State, h *host) {
			if live(v, n, h.Gen) {
				n.S.Settled, h.Phase = true, reporting
			} else {
				h.Phase = idle // 409: the lease is gone
			}
		}))
		add(name("settlement fails"), with(func(_ *State, h *host) { h.Phase = failing }))
	case reporting, failing:
		if !h.Finish {
			add(name("sends its terminal report"), with(func(_ *State, h *host) {
				h.Finish, h.FinishGen, h.FinishOK = true, h.Gen, h.Phase == reporting
				h.Phase = idle
			}))
		}
	}
}

// release applies a host's release: requeue the live attempt, only when
// no membership admitted the job (R36), unless the variant breaks it.
func release(v Variant, n *State, h *host) {
	if !live(v, n, h.Gen) {
		return
	}
	if n.S.Admitted && v != ReleaseIgnoresAdmission {
		return // 409 admitted
	}
	n.S.Job = jobQueued
	n.S.Releases++
}
