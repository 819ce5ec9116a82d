// Package sandbox is how a turn reaches its conversation's retained sandbox.
//
// Two layers live here:
//
//   - Backend: the lifecycle of one retained sandbox per conversation —
//     read-only preflight, find-or-create, remove. Implementations are
//     sandbox/process (a local process, no isolation, the embedded default)
//     and sandbox/docker (a retained container per conversation).
//   - Client: the turn itself, spoken to the sandbox manager ("runnerd
//     supervise", package sandbox/supervisor) over its unix socket —
//     activate, run the turn with the prompt once, settle. Every backend runs
//     the same supervisor and hands back the host path of its socket, so the
//     turn code is the same whatever the backend.
//
// A turn child uses them in this order (architecture, steps 3–7; error
// handling left out):
//
//	spec := sandbox.SpecFromClaim(payload.Claim)
//	err := b.Preflight(ctx, spec)   // before ACCEPT; starts, creates, changes nothing
//	sb, err := b.Ensure(ctx, spec)  // after ACCEPT: find or create; the supervisor answers
//	sess.RecordContainer(ctx, sb.Backend, sb.ID) // before admission (R29)
//	c := sb.Client()
//	act, err := c.Activate(ctx, lease.Deadline) // fences every older token, stops its agent
//	// act.NativeTurn against payload.Turn.NativeTurn: the boundary to resume (R31)
//	adm, err := sess.Admit(ctx, act.ID)
//	turn, err := settlement.SendPrompt(turnCtx, adm, func(ctx context.Context, p string) (*sandbox.Turn, error) {
//		return c.Run(ctx, act.ID, spec.AgentCommand, p) // the prompt, once (R25)
//	})
//	defer turn.Close()
//	for {
//		ev, err := turn.Next()      // io.EOF: the agent ended on its own
//		if err != nil { break }
//		sess.Event(ev.Type, ev.Data)
//	}
//	res, err := turn.Result()       // exit code, native turn
//	boundary, err := sess.Settle(ctx, adm, func(ctx context.Context) (wire.SupervisorReceipt, error) {
//		return c.Settle(ctx, act.ID) // same receipt again until another activation (R26)
//	})
//
// turnCtx bounds the whole turn (the execution timeout, R5, and the lease):
// when it ends, the driving connection closes and the supervisor kills the
// agent.
//
// Who may import: runner (and the turn child it runs), the backends
// (sandbox/process, sandbox/docker) and sandbox/supervisor. sandbox imports
// only wire (and golang.org/x/sys).
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Backend names, as recorded with the control plane (wire.ContainerRequest.Backend).
const (
	BackendProcess = "process"
	BackendDocker  = "docker"
)

// Limits are a conversation's resource limits as the claim carries them
// (wire.Limits): the backends take them from here, not from wire.
type Limits = wire.Limits

// Spec is what a backend needs to know about a conversation's sandbox. It
// comes from the claimed turn (SpecFromClaim).
type Spec struct {
	ConversationID string
	// Image is the container image (docker); the process backend ignores it.
	Image string
	// AgentCommand is the agent's argv, run in the workspace. Backends may
	// check in Preflight that it can be started; Client.Run passes it to the
	// supervisor.
	AgentCommand []string
	// RecordedID is the sandbox identity the control plane last recorded for
	// the conversation (wire.Turn.ContainerID), "" if none. Backends use it
	// to find the exact retained sandbox; callers compare it with
	// Sandbox.ID to see whether the retained native session is the one the
	// control plane knows (R29, R31).
	RecordedID string
	// Limits are the conversation's resource limits. A backend that
	// cannot apply one that is set refuses it in Preflight
	// (ClassLimitsUnsupported): a sandbox is never silently unlimited.
	Limits Limits
	// Cluster is the identity of the control plane's cluster that granted
	// the turn (wire.Claim.ClusterID), "" from a control plane that sends
	// none. A backend records it, durably, with a sandbox it creates and
	// never changes it after: the sweep judges that sandbox only by this
	// cluster's answer (K8 per sandbox).
	Cluster string
}

// Listed is one retained sandbox as a backend lists it for the sweep.
type Listed struct {
	ConversationID string
	// Cluster is the cluster identity the sandbox was created under
	// (Spec.Cluster), "" for a sandbox created before the backend recorded
	// one, or from a control plane that sent none: the sweep judges those
	// under the host's pinned cluster.
	Cluster string
}

// ClusterUnreadable is the Cluster a backend lists for a sandbox whose
// recorded cluster cannot be read. It holds a "/", which no cluster
// identity a backend records does, so no control plane's answer matches it
// and nothing removes that sandbox.
const ClusterUnreadable = "unreadable/"

// SpecFromClaim builds the Spec of a claimed turn.
func SpecFromClaim(c wire.Claim) Spec {
	t := c.Turn
	return Spec{
		ConversationID: t.ConversationID,
		Image:          t.Image,
		AgentCommand:   append([]string(nil), t.AgentCommand...),
		RecordedID:     t.ContainerID,
		Limits:         t.Limits,
		Cluster:        c.ClusterID,
	}
}

// Sandbox is a handle on a conversation's retained sandbox whose supervisor
// is running and answering on Socket.
type Sandbox struct {
	// Backend is BackendProcess or BackendDocker.
	Backend string
	// ID is the sandbox's identity, to be recorded with the control plane
	// before admission (wire.ContainerRequest.ContainerID): the container id
	// for docker, a random id kept with the workspace for process. It stays
	// the same for as long as the retained native session exists; a sandbox
	// that had to be made anew has a new ID.
	ID string
	// Socket is the host path of the supervisor's unix socket.
	Socket string
	// Created reports that Ensure made the sandbox (or its supervisor) anew
	// rather than finding it running.
	Created bool
	// Version is the protocol version its supervisor speaks (Status.Version).
	// Below ProtocolVersion the backend could not replace it (it was busy,
	// or the backend cannot start this build's supervisor in it), and the
	// turn runs with that version's features.
	Version int
	// Pulled is the image pull Ensure made to create the sandbox, nil when
	// it pulled nothing (docker --pull; the job timeline's image_pulled).
	Pulled *ImagePull
}

// ImagePull is one image pull a backend made.
type ImagePull struct {
	Image    string        // as the conversation names it
	Duration time.Duration // from the pull's request to its stream's end
}

// Client returns a supervisor client for the sandbox's socket, speaking
// the supervisor's version.
func (s Sandbox) Client() *Client { return &Client{Socket: s.Socket, Version: s.Version} }

// Backend manages the retained sandboxes of one host. Implementations are
// safe for concurrent use by several turn children (they serialise per
// conversation themselves, across processes), and find their sandboxes
// again from a fresh value after the daemon restarts: no state that matters
// lives only in memory.
type Backend interface {
	// Name is BackendProcess or BackendDocker.
	Name() string

	// Preflight checks, read-only, that a turn of this conversation can
	// start here (docker: engine reachable, image reference valid and,
	// when nothing may be pulled, the image present; network present; the
	// retained container, if any, inspectable). It runs before the
	// child ACCEPTs, so a failure lets the host release the claim (R33): it
	// must start, create and change nothing. A failure is a
	// *PreflightError carrying a class for the DECLINE frame.
	Preflight(ctx context.Context, spec Spec) error

	// Ensure finds the conversation's retained sandbox, or creates it, and
	// returns once its supervisor answers on its socket. An idle supervisor
	// that speaks a protocol older than ProtocolVersion is replaced by this
	// build's, over the same sandbox and supervisor state (its in-memory
	// receipts go, R28; its recorded boundary stays). Finding is by
	// durable markers (labels, files), never by a name alone. A sandbox
	// whose supervisor died is restarted over the same workspace: the
	// native session continues, the supervisor's receipts are gone (R28).
	Ensure(ctx context.Context, spec Spec) (Sandbox, error)

	// Remove stops the conversation's supervisor and deletes its sandbox,
	// workspace included. Removing what is not there is not an error.
	Remove(ctx context.Context, conversationID string) error
}

// Stopper is a backend that can stop a conversation's sandbox without
// deleting it (idle eviction, S1): the docker backend stops the container
// (its writable layer and workspace volume stay), the process backend
// makes the supervisor exit (its state and workspace stay). The next Ensure
// starts it again over the same sandbox, as after a supervisor restart:
// same ID, the recorded native turn boundary, no receipts (R28).
type Stopper interface {
	// Stop takes the conversation's lock — the one Ensure takes — and
	// then asks idle; only if idle still reports true does it stop the
	// sandbox. A turn child's Ensure waits on that lock, so whatever idle
	// answered stays true until the sandbox is stopped: a turn that comes
	// later finds it stopped and wakes it. A supervisor that says it runs a
	// turn is never stopped (ErrBusy), nor one whose live ACP agent's
	// session could not be loaded again (ErrSessionNotLoadable: stopping
	// would lose the conversation). stopped is false when there was
	// nothing running to stop, or idle said no; err is nil then.
	Stop(ctx context.Context, conversationID string, idle func() bool) (stopped bool, err error)
}

// Preflight failure classes, the reason class of a DECLINE frame.
const (
	ClassEngineUnreachable = "engine_unreachable"    // docker: the engine does not answer
	ClassImageUnavailable  = "image_unavailable"     // docker: the image is not on this host and may not or could not be pulled
	ClassNetworkMissing    = "network_missing"       // docker: the configured network does not exist
	ClassSandboxBroken     = "sandbox_uninspectable" // the retained sandbox exists but cannot be inspected
	ClassSupervisorMissing = "supervisor_missing"    // the supervisor executable cannot be found
	ClassAgentMissing      = "agent_command_missing" // the agent command is empty or cannot be found
	ClassStateDir          = "state_dir_unusable"    // process: the state directory cannot hold sandboxes
	ClassInvalidSpec       = "invalid_sandbox_spec"  // the spec itself is unusable (e.g. a bad conversation id)
	ClassLimitsUnsupported = "limits_unsupported"    // the conversation has a limit this backend cannot apply
)

// ConversationFault reports whether a preflight failure of class is the
// conversation's own (S4): its image is unavailable, its agent command is
// missing or not executable, its spec is unusable, or it has a limit this
// host's backend cannot apply. Another conversation
// would launch on this host, so such a failure declines that turn only and
// never counts toward the host's launch backoff (R37). Every other class —
// the engine unreachable, the network missing, the supervisor or the state
// directory unusable, a retained sandbox that cannot be inspected, and any
// class this build does not know — is the host's.
func ConversationFault(class string) bool {
	switch class {
	case ClassImageUnavailable, ClassAgentMissing, ClassInvalidSpec, ClassLimitsUnsupported:
		return true
	}
	return false
}

// PreflightError is a failed read-only preflight. Class is one of the
// Class* constants; Err is detail for operators and never holds a token.
type PreflightError struct {
	Class string
	Err   error
}

func (e *PreflightError) Error() string {
	if e.Err == nil {
		return "sandbox preflight: " + e.Class
	}
	return fmt.Sprintf("sandbox preflight: %s: %v", e.Class, e.Err)
}

func (e *PreflightError) Unwrap() error { return e.Err }

// ErrWorkspaceLost is a backend's refusal in Ensure: the control plane
// recorded a sandbox for the conversation (it has a native session), but
// this host has neither its container nor its workspace. Starting an
// empty workspace would silently drop the session. It lives here, not in
// the docker backend that returns it, so that the turn child can tell it
// apart without linking that backend (cmd/runnerd-child).
var ErrWorkspaceLost = errors.New("the conversation's workspace volume is missing on this host")

// ErrImageUnavailable is a backend's failure in Ensure: the sandbox had to
// be made from the conversation's image, and the image is not on this host
// and could not be pulled (or the pull policy forbids it). It is the
// conversation's fault (S4): the turn fails before admission, the
// conversation stays usable, and the host is not paused.
var ErrImageUnavailable = errors.New("the conversation's image is unavailable on this host")

// Sentinel errors of the supervisor protocol. Client methods wrap them;
// check with errors.Is.
var (
	// ErrFenced: the activation token was fenced by a newer activation. The
	// caller no longer owns the sandbox and must write nothing more.
	ErrFenced = errors.New("activation fenced by a newer activation")
	// ErrUnknownActivation: the supervisor has never issued this token —
	// typically it restarted since (receipts live in memory only). A
	// completion that needs this token's receipt fails closed (R28).
	ErrUnknownActivation = errors.New("activation unknown to the supervisor")
	// ErrAlreadyRun: the activation has already been given a prompt. A
	// prompt is handed to the agent at most once per activation (R25); a
	// new turn needs a new activation.
	ErrAlreadyRun = errors.New("activation already ran its turn")
	// ErrStartFailed: the agent command could not be started (not found,
	// not executable). No process ran, so the prompt did not reach the
	// agent; the activation is spent all the same.
	ErrStartFailed = errors.New("agent command could not be started")
	// ErrAgentUnresponsive: the ACP agent did not answer initialize (or
	// its session call) within the supervisor's bound; it was stopped. No
	// prompt reached it.
	ErrAgentUnresponsive = errors.New("the agent did not answer")
	// ErrSessionNotLoadable: the conversation's ACP session cannot be
	// loaded into a new agent process: the agent does not advertise
	// loadSession, refused session/load, or the kept id is gone. A new
	// session would forget the conversation, so none is made.
	ErrSessionNotLoadable = errors.New("the kept agent session cannot be loaded")
	// ErrBusy: the turn is still running, so it cannot be settled yet.
	ErrBusy = errors.New("turn still running")
	// ErrNotRun: settle was asked for an activation that never ran a turn.
	ErrNotRun = errors.New("activation ran no turn")
	// ErrInterrupted: the turn did not complete — the driving connection
	// dropped, a newer activation stopped it, or the supervisor died. No
	// receipt exists for it, ever: the completion is uncertain and fails
	// closed (R28, R35).
	ErrInterrupted = errors.New("turn interrupted")
	// ErrDeadlinePassed: the activation's lease deadline passed: its agent
	// was stopped (or is not started) by the supervisor itself (K5).
	ErrDeadlinePassed = errors.New("lease deadline passed")
	// ErrOutdated: the supervisor's protocol version does not know the
	// operation; nothing was sent.
	ErrOutdated = errors.New("the supervisor's protocol version does not know the operation")
	// ErrUnavailable: no supervisor answers on the socket.
	ErrUnavailable = errors.New("supervisor unavailable")
	// ErrProtocol: the peer said something this version does not accept
	// (bad JSON, an oversize message, an unknown operation).
	ErrProtocol = errors.New("supervisor protocol error")
)
