// Package checker holds the history of a chaos campaign and its
// Jepsen-style checker. The campaign (package integration/chaos) records
// what it observes — every request and answer between the hosts and the
// control planes, every process start and exit, every prompt an agent
// received, every job event, the final states and the leftovers — as one
// JSON record per line, with a Writer; Check reads the history back and
// counts the violations of the product's promise, each with the lines that
// prove it.
//
// The history names things the way the product does: ids and states are
// the wire types' (job_id, attempt_id, lease_generation, the user API's
// Job and Conversation as they were read at the end), and a call is the
// last element of its path (wire.OpRenew, …). Times are on the recorder's
// clock — the campaign's own process — except inside wire types, whose
// times are the control plane's database clock; the checker never
// compares the two.
//
// Nothing of the product imports this package.
package checker

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Kind says what a record observed; exactly one of Record's payloads is set,
// the one its Kind names.
type Kind string

// Record kinds.
const (
	KindHTTP         Kind = "http"         // one request and its answer (Record.HTTP)
	KindProcess      Kind = "process"      // a process started or exited (Record.Process)
	KindPrompt       Kind = "prompt"       // an agent received a prompt: a transcript line (Record.Prompt)
	KindEvent        Kind = "event"        // one job event, from the user API (Record.Event)
	KindJob          Kind = "job"          // a job as the user API showed it at the end (Record.Job); one for every job the history names
	KindConversation Kind = "conversation" // a conversation as the user API showed it at the end (Record.Conversation)
	KindLeftover     Kind = "leftover"     // a process or sandbox still there at the end (Record.Leftover)
	KindFault        Kind = "fault"        // a fault the campaign injected (Record.Fault)
	KindDaemon       Kind = "daemon"       // a record a daemon or its turn child wrote (Record.Daemon)
	KindServer       Kind = "server"       // a host's state on Admin → Servers, when it changed (Record.Server)
)

// Record is one line of the history. The common fields say who and what it
// is about, as far as the recorder knows; the payload says what happened.
type Record struct {
	Kind Kind `json:"kind"`
	// Time is when the recorder observed it. For HTTP, when the answer
	// arrived or the recorder gave up on one.
	Time time.Time `json:"time"`

	Host           string `json:"host,omitempty"`    // the runnerd host's name (wire.Server.Name)
	Replica        string `json:"replica,omitempty"` // the control-plane replica that answered or was hit
	ConversationID string `json:"conversation_id,omitempty"`
	JobID          string `json:"job_id,omitempty"`
	AttemptID      string `json:"attempt_id,omitempty"`
	// LeaseGeneration is the attempt's fencing token (wire.AttemptRef).
	LeaseGeneration int64 `json:"lease_generation,omitempty"`

	HTTP         *HTTP              `json:"http,omitempty"`
	Process      *Process           `json:"process,omitempty"`
	Prompt       *Prompt            `json:"prompt,omitempty"`
	Event        *wire.JobEvent     `json:"event,omitempty"`
	Job          *wire.Job          `json:"job,omitempty"`
	Conversation *wire.Conversation `json:"conversation,omitempty"`
	Leftover     *Leftover          `json:"leftover,omitempty"`
	Fault        *Fault             `json:"fault,omitempty"`
	Daemon       *Daemon            `json:"daemon,omitempty"`
	Server       *Server            `json:"server,omitempty"`

	// Line is the record's line in the history, from 1, set by Read; the
	// evidence of a violation cites it.
	Line int `json:"-"`
}

// HTTP is one request from a host (or the campaign's user) to a control
// plane and what became of it. Record it where the answer leaves the
// replica — between the fault proxy and the replica — so that an answer
// the control plane gave and a fault withheld is still seen, and fill the
// Record's job from the path and the attempt and generation from the
// body's wire.AttemptRef (the claim's from its answer).
type HTTP struct {
	Method string `json:"method"`
	Path   string `json:"path"` // without the query; never a token
	// Call is CallOf(Method, Path): wire.OpRenew, CallClaim, ….
	Call string    `json:"call"`
	Sent time.Time `json:"sent"` // the request reached the recorder
	// Answered is when the control plane's answer reached the recorder;
	// nil when none did (a transport failure, a timeout, a reset).
	Answered *time.Time `json:"answered,omitempty"`
	// Status is the control plane's HTTP status; 0 when it gave none.
	Status int `json:"status,omitempty"`
	// Code is the wire.ErrorBody code of a non-2xx answer.
	Code string `json:"code,omitempty"`
	// Withheld says the control plane answered (Status) but a fault kept
	// the answer from the client: drop_response, a reset or a timeout
	// after the answer. The write happened; its sender never knew.
	Withheld bool `json:"withheld,omitempty"`
	// Error is a short class of the failure when there was no answer
	// ("timeout", "reset", "refused"); never an error's free text.
	Error string `json:"error,omitempty"`
}

// Calls that are not attempt-scoped operations (those are wire.Op*).
const (
	CallClaim         = "claim"         // POST wire.PathClaim
	CallHostHeartbeat = "heartbeat"     // POST wire.PathHostHeartbeat
	CallConversations = "conversations" // POST wire.PathConversations
	CallCancels       = "cancels"       // POST wire.PathCancels
	// The user API.
	CallCreateConversation = "create_conversation" // POST /v1/conversations
	CallSendMessage        = "send_message"        // POST /v1/conversations/{id}/messages
	CallCancelJob          = "cancel_job"          // POST /v1/jobs/{id}/cancel
	CallLoseConversation   = "lose_conversation"   // POST /v1/admin/conversations/{id}/lose (an operator's word)
	CallRead               = "read"                // any GET
	CallOther              = "other"
)

// workerJobPrefix starts every attempt-scoped path (wire.AttemptPath).
const workerJobPrefix = "/v1/agent/worker/jobs/"

// attemptOps are the attempt-scoped calls: every one is a write fenced by
// the attempt's lease generation (P1).
var attemptOps = map[string]bool{
	wire.OpRenew: true, wire.OpEvents: true, wire.OpContainer: true, wire.OpAdmission: true,
	wire.OpSettlement: true, wire.OpNotices: true, wire.OpAbandon: true, wire.OpRelease: true,
	wire.OpFinish: true,
}

// IsAttemptWrite says call is an attempt-scoped write, fenced by P1.
func IsAttemptWrite(call string) bool { return attemptOps[call] }

// CallOf names the call of a request by its method and path, and returns
// the job id of an attempt-scoped path (POST /v1/agent/worker/jobs/{job}/{op})
// or of /v1/jobs/{id}/…, "" otherwise.
func CallOf(method, path string) (call, jobID string) {
	if method == "GET" || method == "HEAD" {
		return CallRead, ""
	}
	switch path {
	case wire.PathClaim:
		return CallClaim, ""
	case wire.PathHostHeartbeat:
		return CallHostHeartbeat, ""
	case wire.PathConversations:
		return CallConversations, ""
	case wire.PathCancels:
		return CallCancels, ""
	case "/v1/conversations":
		return CallCreateConversation, ""
	}
	if rest, ok := strings.CutPrefix(path, workerJobPrefix); ok {
		if job, op, ok := strings.Cut(rest, "/"); ok && attemptOps[op] && job != "" {
			return op, job
		}
	}
	if rest, ok := strings.CutPrefix(path, "/v1/conversations/"); ok && strings.HasSuffix(rest, "/messages") {
		return CallSendMessage, ""
	}
	if rest, ok := strings.CutPrefix(path, "/v1/admin/conversations/"); ok && strings.HasSuffix(rest, "/lose") {
		return CallLoseConversation, ""
	}
	if rest, ok := strings.CutPrefix(path, "/v1/jobs/"); ok {
		if job, ok := strings.CutSuffix(rest, "/cancel"); ok && job != "" {
			return CallCancelJob, job
		}
	}
	return CallOther, ""
}

// Process roles.
const (
	RoleDaemon     = "daemon"     // runnerd run
	RoleChild      = "child"      // runnerd turn: one attempt's child
	RoleSupervisor = "supervisor" // runnerd supervise: one conversation's sandbox manager
	RoleAgent      = "agent"      // the agent of one attempt, in its sandbox
	// RoleAgentTurn is one turn of an ACP agent, which its supervisor
	// keeps across turns: its start is the session/prompt sent, its exit
	// the answer (or failure) received.
	RoleAgentTurn = "agent_turn"
	RoleSandbox   = "sandbox" // a retained sandbox (a Docker container)
	RoleHost      = "host"    // a whole host (its container or namespace)
	RoleReplica   = "replica" // a control-plane replica
	RolePostgres  = "postgres"
)

// Process events.
const (
	ProcessStart = "start"
	ProcessExit  = "exit"
)

// Process is a process's start or exit. Set the Record's host, and its
// conversation, job and attempt where they are known (an agent's and a
// child's are; a supervisor's conversation is).
type Process struct {
	Role  string `json:"role"`
	Event string `json:"event"` // ProcessStart | ProcessExit
	PID   int    `json:"pid,omitempty"`
	// Activation is, for an agent or an agent's turn the supervisor
	// recorded, its instance and the activation's generation
	// ("instance.generation"): the prefix of the activation id the
	// control plane records with the attempt's admission, which names
	// the attempt the agent ran for.
	Activation string `json:"activation,omitempty"`
	// ContainerID names a sandbox container (RoleSandbox).
	ContainerID string `json:"container_id,omitempty"`
	// ExitCode is the exit status of a process that exited on its own.
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal names the signal that ended it ("KILL", "TERM").
	Signal string `json:"signal,omitempty"`
}

// Prompt is one line of an agent's transcript: the prompt it received.
// Set the Record's host and conversation; the checker finds the job by
// the prompt's text (the campaign makes every prompt unique).
type Prompt struct {
	Text string `json:"text"`
	// NativeTurn is the agent's own turn ordinal for the prompt.
	NativeTurn int64 `json:"native_turn"`
}

// Leftover kinds.
const (
	LeftoverProcess = "process"
	LeftoverSandbox = "sandbox"
)

// Leftover is a process or a sandbox still there once the campaign ended
// every turn and stopped its daemons. A retained conversation's supervisor
// and sandbox are expected (one each per usable or quarantined
// conversation); the checker judges which leftovers leaked.
type Leftover struct {
	What        string `json:"what"` // LeftoverProcess | LeftoverSandbox
	Role        string `json:"role"` // a Role*
	PID         int    `json:"pid,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
}

// Fault kinds. Network faults target the link between Record.Host (or
// Record.Replica) and the control planes; process faults target the
// process Fault.Role names there.
const (
	FaultLatency      = "latency"
	FaultBandwidth    = "bandwidth"
	FaultTimeout      = "timeout"       // the link stops passing data
	FaultReset        = "reset"         // connections reset
	FaultLoss         = "loss"          // one-way loss
	FaultDropResponse = "drop_response" // forward and commit, never answer
	FaultPartition    = "partition"     // the host or replica cut off the network
	FaultKill         = "kill"          // kill -9
	FaultStop         = "stop"          // SIGSTOP … SIGCONT at End
	FaultRestart      = "restart"       // stopped and started again
	FaultClockOffset  = "clock_offset"  // a replica's clock moved (Fault.Detail says by how much)
	FaultPGRestart    = "postgres_restart"
	// FaultSandboxRemoved: the retained sandbox of Record.ConversationID
	// was removed or damaged on purpose; its conversation may be LOST.
	FaultSandboxRemoved = "sandbox_removed"
)

// Fault is one fault the campaign injected, recorded when it ends (or at
// its start with End nil if it never ended).
type Fault struct {
	Kind  string     `json:"kind"`
	Role  string     `json:"role,omitempty"` // process faults: whose process (Role*)
	Start time.Time  `json:"start"`
	End   *time.Time `json:"end,omitempty"`
	// Detail is the fault's parameters ("latency=800ms jitter=200ms",
	// "offset=-3m"); never a secret.
	Detail string `json:"detail,omitempty"`
}

// Daemon is one of the records of a host's daemon or turn child the
// campaign keeps (its msg: diagnostics.MsgLeaseExpired, MsgLeaseLost,
// MsgSandboxEvicted, MsgSandboxWoken, runner.MsgControlPlaneSwitched),
// with the Record's host, job, attempt and conversation from its keys.
type Daemon struct {
	Msg string `json:"msg"`
}

// Server is a host's row on Admin → Servers as the campaign's user read
// it: recorded when its state changed (wire.HostState).
type Server struct {
	State string `json:"state"`
	// HeartbeatIntervalMS is the interval the host announced: the
	// control plane calls it offline after wire.OfflineAfterIntervals
	// of them without a heartbeat.
	HeartbeatIntervalMS int64 `json:"heartbeat_interval_ms,omitempty"`
}

// payloads says which payloads r has set, by kind.
func (r Record) payloads() []Kind {
	var ks []Kind
	for k, set := range map[Kind]bool{
		KindHTTP: r.HTTP != nil, KindProcess: r.Process != nil, KindPrompt: r.Prompt != nil,
		KindEvent: r.Event != nil, KindJob: r.Job != nil, KindConversation: r.Conversation != nil,
		KindLeftover: r.Leftover != nil, KindFault: r.Fault != nil, KindDaemon: r.Daemon != nil,
		KindServer: r.Server != nil,
	} {
		if set {
			ks = append(ks, k)
		}
	}
	return ks
}

// Writer appends records to a history, one JSON line each. It is safe for
// concurrent use; every Write is one line, written whole.
type Writer struct {
	mu  sync.Mutex // guards w and err: one line at a time
	w   *bufio.Writer
	f   *os.File // nil unless Create opened it
	err error    // the first write error; later writes do nothing
}

// NewWriter writes a history to w. Call Flush (or Close) at the end.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriter(w)} }

// Create opens (creating, or appending to) the history file at path.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create history: %w", err)
	}
	w := NewWriter(f)
	w.f = f
	return w, nil
}

// Write appends r. Its Kind is set from its one payload; a record with no
// payload or more than one is refused. A zero Time becomes now.
func (w *Writer) Write(r Record) error {
	ks := r.payloads()
	if len(ks) != 1 {
		return fmt.Errorf("history record: %d payloads, want exactly one", len(ks))
	}
	if r.Kind != "" && r.Kind != ks[0] {
		return fmt.Errorf("history record: kind %q with a %q payload", r.Kind, ks[0])
	}
	r.Kind = ks[0]
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("history record: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if _, err := w.w.Write(append(b, '\n')); err != nil {
		w.err = fmt.Errorf("write history: %w", err)
	}
	return w.err
}

// Flush writes what is buffered.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		if err := w.w.Flush(); err != nil {
			w.err = fmt.Errorf("flush history: %w", err)
		}
	}
	return w.err
}

// Close flushes and closes the file Create opened.
func (w *Writer) Close() error {
	err := w.Flush()
	if w.f != nil {
		err = errors.Join(err, w.f.Close())
	}
	return err
}

// Read reads a history: one record per line, blank lines skipped. Each
// record's Line is its line number.
func Read(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(line, &rec); err != nil {
			return out, fmt.Errorf("history line %d: %w", n, err)
		}
		if ks := rec.payloads(); len(ks) != 1 || ks[0] != rec.Kind {
			return out, fmt.Errorf("history line %d: kind %q does not match its payload", n, rec.Kind)
		}
		rec.Line = n
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read history: %w", err)
	}
	return out, nil
}

// ReadFile reads the history at path.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	defer f.Close()
	return Read(f)
}
