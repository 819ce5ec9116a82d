package sandbox

import (
	"encoding/json"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/wire"
)

// The supervisor protocol: JSON lines over a unix socket, one request per
// connection.
//
//	client → supervisor            supervisor → client
//	{"v":…,"op":"status"}          {"status":{…,"version":…}}
//	{"op":"activate",              {"activation":{…,"previous":{…}}}
//	 "lease_deadline":…}
//	{"op":"deadline",              {"deadline":{…}}
//	 "activation":…,"lease_deadline":…}
//	{"op":"run","activation":…,    {"started":{…}}  once the agent runs and has the prompt
//	 "command":[…],"prompt":…}     {"event":{…}}    one per agent stdout line
//	                               {"end":{…}}      the agent exited on its own
//	{"op":"settle","activation":…} {"receipt":{…}}
//	{"op":"interrupt",             {"receipt":{…}}  once the agent stopped
//	 "activation":…,"grace_ms":…}
//	{"op":"prepare","protocol":"acp", {"prepared":{…}} the ACP agent runs with its session
//	 "activation":…,"command":[…]}
//	{"op":"run","protocol":"acp",  as "run" above; the events are its session/updates,
//	 "permission_policy":…,…}      and {"op":"answer","request_id":…,"option_id":…}
//	                               lines on the driving connection answer its
//	                               permission requests under "ask"
//	any                            {"error":{"code":…,"message":…}} and close
//
// The connection that sent "run" is the driving connection: when it closes
// before "end", the supervisor stops the agent (kills its process group) and
// the turn is interrupted — it has no receipt, ever.
//
// "interrupt" is the other way to end a running turn (K10, the user's
// cancel): the supervisor sends the agent's process group SIGINT, as a
// terminal's Ctrl-C would, kills it with SIGKILL if it is still there
// grace_ms later (0: DefaultInterruptGrace; at most MaxInterruptGrace),
// waits until nothing of the turn runs, and settles an interrupted boundary:
// the native turn ordinal moves on as for a completed turn, and the answer
// is the activation's receipt with "interrupted":true — retained and
// answered again to "settle" and "interrupt" with the same token until the
// next activation (R26). The driving connection then gets an "interrupted"
// error. An interrupt of a turn that already ended on its own answers that
// turn's ordinary receipt; of a turn stopped any other way, "interrupted"
// (no receipt).
//
// lease_deadline is the turn's lease deadline, an instant of CLOCK_BOOTTIME
// in nanoseconds (package boottime; the same clock inside a container as on
// the host). The turn child sends it with "activate" and again, with
// "deadline", after every renewal the daemon saw acknowledged. When it
// passes, the supervisor stops the agent itself — even if the turn child is
// frozen and its driving connection stays open — and refuses "run" (K5).
// The newest "deadline" of the current activation wins; 0 means none. Every message is one
// line of at most MaxMessageBytes; each agent stdout line is cut at
// MaxEventBytes.

// Versions of the protocol. A supervisor says in "status" which it speaks
// (Status.Version; the supervisors of earlier releases say nothing, which
// is Version1) and serves requests of that version and every earlier one.
// The client sends each request at the version the supervisor speaks and
// only what that version knows (Client.Version): a supervisor is retained
// across turns and daemon upgrades, so the turn side is often the newer.
//
//	1  status, activate, run, settle: the protocol every supervisor serves.
//	   (Supervisors of earlier releases also took lease_deadline, deadline
//	   and interrupt at "v":1, but only some of them and they cannot be
//	   told apart: an unversioned supervisor gets version 1's requests.)
//	2  lease_deadline on activate, deadline, interrupt, status's version,
//	   and activate's "previous": the retained record of the activation it
//	   fenced (Retained, R26, K13).
//	3  prepare, and "protocol":"acp" on run: the conversation's agent
//	   spoken to over the Agent Client Protocol (docs/agents.md).
//
// A backend replaces an idle supervisor older than ProtocolVersion at the
// next turn, over the same sandbox and state (docs/operations.md).
const (
	Version1        = 1
	Version2        = 2
	Version3        = 3
	ProtocolVersion = Version3 // the newest, which this build's supervisor speaks
)

// Operations.
const (
	OpStatus    = "status"
	OpActivate  = "activate"
	OpRun       = "run"
	OpSettle    = "settle"
	OpDeadline  = "deadline"
	OpInterrupt = "interrupt"
	OpPrepare   = "prepare"
	// OpAnswer is sent on the driving connection of an ACP run, after its
	// "run" request: the answer to a pending permission request.
	OpAnswer = "answer"
)

// AgentProtocolACP on a request: the conversation's agent speaks the Agent
// Client Protocol (wire.AgentProtocolACP). Absent: the line protocol.
const AgentProtocolACP = wire.AgentProtocolACP

// Bounds of an interrupt's grace (Request.GraceMS).
const (
	DefaultInterruptGrace = 3 * time.Second
	MaxInterruptGrace     = time.Minute
)

// Size bounds. A prompt is at most wire.MaxBodyBytes when it arrives in a
// claim; JSON escaping can grow it, hence the margin.
const (
	MaxMessageBytes = 8 << 20
	MaxEventBytes   = 256 << 10
)

// Error codes of ErrorReply, one per sentinel error.
const (
	CodeFenced            = "fenced"
	CodeUnknownActivation = "unknown_activation"
	CodeAlreadyRun        = "already_run"
	CodeBusy              = "busy"
	CodeNotRun            = "not_run"
	CodeInterrupted       = "interrupted"
	CodeProtocol          = "protocol"
	CodeStartFailed       = "start_failed" // the agent command could not be started
	CodeDeadlinePassed    = "deadline_passed"
	CodeOutdated          = "outdated"                 // the client's own: the supervisor's version lacks the operation
	CodeAgentUnresponsive = "agent_unresponsive"       // the ACP agent did not answer initialize or its session call in time
	CodeNotLoadable       = "acp_session_not_loadable" // the kept ACP session cannot be loaded
)

// Request is one client request.
type Request struct {
	V          int      `json:"v"`
	Op         string   `json:"op"`
	Activation string   `json:"activation,omitempty"`
	Command    []string `json:"command,omitempty"`
	Prompt     string   `json:"prompt,omitempty"`
	// LeaseDeadline is the lease deadline of activate and deadline.
	LeaseDeadline boottime.Instant `json:"lease_deadline,omitempty"`
	// GraceMS is how long interrupt lets the agent stop on SIGINT before
	// it is killed.
	GraceMS int64 `json:"grace_ms,omitempty"`
	// Protocol is AgentProtocolACP on prepare and on run of an ACP
	// conversation (Version3); absent for the line protocol.
	Protocol string `json:"protocol,omitempty"`
	// PermissionPolicy is an ACP run's answer to permission requests.
	PermissionPolicy string `json:"permission_policy,omitempty"`
	// PermissionTimeoutMS bounds, on an ACP run under the ask policy, how
	// long a permission request waits for the owner's answer before it is
	// answered cancelled (0: DefaultPermissionTimeout).
	PermissionTimeoutMS int64 `json:"permission_timeout_ms,omitempty"`
	// RequestID and OptionID are an "answer" on the driving connection of
	// an ACP run: the owner's choice for a pending permission request.
	RequestID string `json:"request_id,omitempty"`
	OptionID  string `json:"option_id,omitempty"`
}

// DefaultPermissionTimeout is how long an ACP permission request under the
// ask policy waits for the owner's answer.
const DefaultPermissionTimeout = 10 * time.Minute

// Prepared is the answer to prepare: the agent runs with the
// conversation's session. The session id itself stays in the
// supervisor's state.
type Prepared struct {
	PID int `json:"pid"`
	// Started: the agent process was started for this answer (it was not
	// running); Loaded: the kept session was loaded into it (session/load),
	// rather than created (session/new) or kept running.
	Started bool `json:"started,omitempty"`
	Loaded  bool `json:"loaded,omitempty"`
}

// Response is one line from the supervisor; exactly one field is set.
type Response struct {
	Error      *ErrorReply             `json:"error,omitempty"`
	Status     *Status                 `json:"status,omitempty"`
	Activation *Activation             `json:"activation,omitempty"`
	Started    *Started                `json:"started,omitempty"`
	Event      *Event                  `json:"event,omitempty"`
	End        *Result                 `json:"end,omitempty"`
	Receipt    *wire.SupervisorReceipt `json:"receipt,omitempty"`
	Deadline   *Deadline               `json:"deadline,omitempty"`
	Prepared   *Prepared               `json:"prepared,omitempty"`
}

// Deadline is the answer to deadline: the lease deadline the supervisor now
// holds for the activation.
type Deadline struct {
	LeaseDeadline boottime.Instant `json:"lease_deadline"`
}

// ErrorReply is a refused request. Message is plain detail without secrets.
type ErrorReply struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// Status is the supervisor's view of itself.
type Status struct {
	// Version is the protocol version the supervisor speaks; 0 (absent)
	// from the supervisors of earlier releases, which is Version1.
	Version int `json:"version,omitempty"`
	// ID is the identity the supervisor was started with (--id).
	ID  string `json:"id"`
	PID int    `json:"pid"`
	// Busy reports only the agent-turn transport: an agent process started
	// by "run" is alive. It is NOT proof that nothing touches the workspace
	// (R31): workspace setup and other preparation commands run outside
	// this transport, and a runner that lost its lease may still be
	// preparing. Recovery fences with a new activation and verifies the
	// native turn boundary instead of trusting busy=false.
	Busy bool `json:"busy"`
	// Unloadable: the conversation's ACP agent process is alive and did
	// not advertise loadSession — its session lives only in that process,
	// so stopping the supervisor would end the conversation's session for
	// good (A6). Idle eviction leaves such a sandbox running (S1).
	Unloadable bool `json:"unloadable,omitempty"`
	// NativeTurn is the native session's last turn ordinal as the
	// supervisor knows it (durable across supervisor restarts).
	NativeTurn int64 `json:"native_turn"`
	// StartedAt is when this supervisor process started; a change means it
	// restarted and knows no earlier activation.
	StartedAt time.Time `json:"started_at"`
}

// Activation is the answer to activate. ID is the activation token: it
// fences every token issued before it. It is a fencing token, not a
// credential (the socket's permissions are the credential), so it may be
// recorded with the control plane (wire.AdmissionRequest.ActivationID).
type Activation struct {
	ID         string `json:"id"`
	NativeTurn int64  `json:"native_turn"` // the boundary the turn starts from
	// Previous is what the supervisor retains of the activation this one
	// fenced: the positive evidence a quarantined conversation's next turn
	// verifies (K13). nil when it retains none — a supervisor of Version1,
	// or one whose state holds no record (a new state, or one whose record
	// was lost: StateVersionFile). For a state it took over from a release
	// that kept no records, it is the record saying so (Unrecorded).
	Previous *Retained `json:"previous,omitempty"`
}

// Retained is the supervisor's record of one activation (R26): its token,
// the native turn boundary it left and how it ended. Each activation's
// record is on disk in the supervisor's state directory (RetainedFile,
// beside NativeTurnFile, out of the agent's reach) before its token is
// handed out, and again as its turn starts and ends; the newest survives a
// restart or a replacement of the supervisor. A record of an activation
// that ran nothing names the last one that ran a turn (LastRan).
type Retained struct {
	Activation string `json:"activation"`
	NativeTurn int64  `json:"native_turn"`
	// Ended is how: EndedNotRun, EndedCompleted, EndedInterruptSettled,
	// EndedUnfinished (its supervisor died during the turn), or
	// the reason it was stopped without a receipt (connection_dropped,
	// fenced, lease_deadline, shutdown).
	Ended string `json:"ended"`
	// LastRan, on a record that ran nothing (EndedNotRun), names the last
	// activation that ran a turn in this state, at this same boundary:
	// an activation that verified and then ran nothing must not hide the
	// interrupted one before it (K13). Empty if none did.
	LastRan string `json:"last_ran,omitempty"`
	// Idle, on a record that ran nothing (EndedNotRun), lists the
	// activations after LastRan that ran nothing either, oldest first, at
	// this same boundary. An activation can be admitted and still run
	// nothing (its turn child stopped between the admission and the
	// prompt); a quarantined conversation's interrupted activation is then
	// one of these, and the records after it must still name it (K13).
	Idle []string `json:"idle,omitempty"`
	// Unrecorded, on a record that ran nothing (EndedNotRun), says that the
	// turns up to NativeTurn ran under a release that kept no records (the
	// previous release, StateVersionFile) and that no activation has run a
	// turn in this state since: the record the supervisor writes as it
	// takes such a state over (Activation empty), and every record of an
	// activation that ran nothing after it. A quarantined conversation's
	// turn interrupted under that release is verified as that release
	// verified it: the exact container and the boundary (K13).
	Unrecorded bool `json:"unrecorded,omitempty"`
	// ACPSession is, for a conversation of the ACP protocol, the agent's
	// session id the supervisor keeps (and loads into a new agent
	// process): part of the boundary a quarantined conversation verifies.
	ACPSession string `json:"acp_session,omitempty"`
}

// How a retained activation ended (Retained.Ended), beside the stop reasons.
const (
	EndedNotRun           = "not_run"   // no prompt reached the agent
	EndedCompleted        = "completed" // the agent ended on its own
	EndedInterruptSettled = "interrupted_on_request"
	// EndedUnfinished: the record written as the turn started, still there
	// when its supervisor died before the turn ended.
	EndedUnfinished = "unfinished"
)

// RetainedFile is the name, in the supervisor's state directory, of the
// record of the last activation that ran a turn (Retained, JSON), written
// before the prompt is handed (EndedUnfinished) and again as the turn ends.
const RetainedFile = "retained.json"

// StateVersionFile is the name, in the supervisor's state directory, of
// the marker that a release keeping retained records (RetainedFile)
// created the state or took it over, holding StateVersion. The previous
// release wrote neither: a state with a boundary (NativeTurnFile) but no
// marker and no record is one of its states, and the supervisor taking it
// over first records that its turns ran unrecorded (Retained.Unrecorded),
// then writes the marker — before any activation's record. From the
// marker on, a state without a record has lost it, and a quarantined
// conversation is not verified on it.
const StateVersionFile = "state_version"

// StateVersion is what StateVersionFile holds: 2, a state that keeps
// retained records (1, the previous release's, has no marker).
const StateVersion = 2

// Started says the agent process runs and the prompt was handed to it.
type Started struct {
	PID int `json:"pid"`
}

// Event is one line of the agent's stdout. Seq counts from 1 within the
// turn. Type is the line's "type" string if it is a JSON object with one,
// else "agent.output"; Data is the line itself (a JSON object as is, any
// other line as a JSON string), or for a line over MaxEventBytes the type
// "agent.output_truncated" and its first MaxEventBytes as a JSON string.
type Event struct {
	Seq  int64           `json:"seq"`
	Time time.Time       `json:"time"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// Wire converts the event for upload (wire.EventsRequest).
func (e Event) Wire() wire.Event {
	return wire.Event{Seq: e.Seq, Time: e.Time, Type: e.Type, Data: e.Data}
}

// Result is how the agent's turn ended on its own.
type Result struct {
	// ExitCode is the agent's exit status, -1 if a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that ended the agent, if one did.
	Signal string `json:"signal,omitempty"`
	// NativeTurn is the native turn ordinal after this turn: the last
	// "native_turn" the agent reported in an event, else the supervisor's
	// own count of turns handed to the agent.
	NativeTurn int64 `json:"native_turn"`
	// StopReason is an ACP turn's stop reason as the agent gave it
	// (end_turn, max_tokens, max_turn_requests, refusal, cancelled).
	StopReason string `json:"stop_reason,omitempty"`
	// Failure names how an ACP turn failed although it ended:
	// FailureACPError (the agent answered session/prompt with a JSON-RPC
	// error) or FailureACPAgentExit (the agent exited during the turn).
	Failure string `json:"failure,omitempty"`
	// Cause is why the agent ended, when it did not exit 0 on its own and
	// was not stopped by the supervisor (S5): agent_exit, agent_signal, or
	// what the sandbox's cgroup and filesystems show — oom_killed,
	// pids_exhausted, disk_full — with CauseEvidence saying what was read.
	// Supervisors of earlier releases send neither.
	Cause         wire.Cause `json:"cause,omitempty"`
	CauseEvidence string     `json:"cause_evidence,omitempty"`
}

// Failures of an ACP turn (Result.Failure).
const (
	FailureACPError     = "acp_prompt_error"
	FailureACPAgentExit = "acp_agent_exit"
	// FailureACPConnection: the agent's stdio stopped being a connection
	// (it closed its stdout, or flooded notifications past the bounded
	// queue); the supervisor stopped it.
	FailureACPConnection = "acp_connection_lost"
)
