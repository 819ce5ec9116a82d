// Package wire holds the JSON types of the runnerd protocol, shared by the
// host daemon and the reference control plane, and a thin client with one
// method per call. docs/protocol.md is the contract; these types mirror it.
//
// Anything may import wire; wire imports nothing of this module.
package wire

import (
	"encoding/json"
	"fmt"
	"time"
)

// Paths of the worker API. Attempt-scoped paths take the job id.
const (
	PathClaim         = "/v1/agent/worker/claim"
	PathHostHeartbeat = "/v1/agent/worker/heartbeat"
	PathRegister      = "/v1/agent/register"
	PathConversations = "/v1/agent/worker/conversations"
	PathCancels       = "/v1/agent/worker/cancels"
	pathJobPrefix     = "/v1/agent/worker/jobs/"
)

// Attempt-scoped operations: the last path element of
// POST /v1/agent/worker/jobs/{job}/{op}.
const (
	OpRenew      = "renew"
	OpEvents     = "events"
	OpContainer  = "container"
	OpAdmission  = "admission"
	OpSettlement = "settlement"
	OpNotices    = "notices"
	OpAbandon    = "abandon"
	OpRelease    = "release"
	OpFinish     = "finish"
	// OpPermissions is the turn child's long poll for the owner's answer
	// to one of its ACP permission requests.
	OpPermissions = "permissions"
)

// AttemptPath is the path of an attempt-scoped call.
func AttemptPath(jobID, op string) string { return pathJobPrefix + jobID + "/" + op }

// MaxBodyBytes bounds every request body the control plane reads.
const MaxBodyBytes = 1 << 20

// ---- errors ----

// Error codes of ErrorBody.Code. They are stable: clients switch on them.
const (
	CodeBadJSON          = "bad_json"           // 400: malformed JSON or trailing data
	CodeUnknownField     = "unknown_field"      // 400: a field this version does not know
	CodeBodyTooLarge     = "body_too_large"     // 400: body over MaxBodyBytes
	CodeInvalid          = "invalid"            // 400: well-formed but a field is wrong
	CodeUnauthorized     = "unauthorized"       // 401: no token, or a token nobody holds
	CodeForbidden        = "forbidden"          // 403: a real token for something else
	CodeNotFound         = "not_found"          // 404
	CodeMethodNotAllowed = "method_not_allowed" // 405: the path is served, not with that method (Allow lists them)
	CodeLeaseLost        = "lease_lost"         // 409: not the live attempt/generation, or lease expired
	CodeAdmitted         = "admitted"           // 409: release/abandon of an admitted job
	CodeNotAdmitted      = "not_admitted"       // 409: settlement/notice before admission
	CodeConversationLost = "conversation_lost"  // 409: a LOST conversation takes no new message
	CodeNotPending       = "not_pending"        // 409: an answer to a permission request that is not waiting
	CodeConversationBusy = "conversation_busy"  // 409: a turn of the conversation runs or waits; cancel it first
	CodeGone             = "gone"               // 410: the job or conversation has ended for good
	CodeInternal         = "internal"           // 500
	// Registration (POST /v1/agent/register) refusals besides
	// unauthorized (an unknown or revoked registration token), forbidden
	// (a label the token does not grant) and host_exists.
	CodeRegistrationExpired = "registration_expired" // 401: the registration token is past its expiry
	CodeRegistrationUsedUp  = "registration_used_up" // 401: the registration token registered its max uses
	CodeHostExists          = "host_exists"          // 409: a live host has that name
	// CodeHostTokenInUse refuses a host heartbeat or claim whose daemon
	// instance is not the host's live one (HeaderInstanceID).
	CodeHostTokenInUse = "host_token_in_use" // 409: another live daemon uses this host token
)

// The daemon names its instance on every host heartbeat and claim, in
// headers (a control plane that predates them ignores them; a request
// without them is not checked). HeaderInstanceID is random per process
// start; HeaderBootID is /proc/sys/kernel/random/boot_id (omitted where
// unreadable); HeaderInstanceStopping ("1") marks the last heartbeat of
// a daemon that stops, releasing the host token at once.
const (
	HeaderInstanceID       = "Runnerd-Instance-Id"
	HeaderBootID           = "Runnerd-Boot-Id"
	HeaderInstanceStopping = "Runnerd-Instance-Stopping"
)

// HostInstance is one daemon instance that presented a host's token.
type HostInstance struct {
	ID       string    `json:"id"`
	BootID   string    `json:"boot_id,omitempty"`
	LastSeen time.Time `json:"last_seen"`
	Stopping bool      `json:"stopping,omitempty"` // its last heartbeat said it stops
}

// ErrorBody is the body of every non-2xx answer. Message is plain language
// for people; it never echoes a token or the request body.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ---- states and outcomes ----

// Job states.
const (
	JobQueued    = "queued"
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
	JobCancelled = "cancelled"
)

// Attempt states.
const (
	AttemptRunning    = "running"
	AttemptFinished   = "finished"    // a terminal report was accepted
	AttemptReleased   = "released"    // given back, never accepted (R33)
	AttemptAbandoned  = "abandoned"   // failed before admission, conversation usable (R29)
	AttemptSuperseded = "superseded"  // the reaper ended it after its lease expired
	AttemptWorkerLost = "worker_lost" // the host died mid-turn before admission (P6)
)

// Conversation states.
const (
	ConversationUsable = "usable"
	ConversationLost   = "lost"
	// ConversationQuarantined: an admitted turn of it ended without a
	// recorded settlement (its settlement tries used up, its lease lost,
	// its host gone). It is not LOST (K13): it takes new messages, and the
	// next turn verifies the retained container and the supervisor's native
	// turn boundary before anything is admitted, then either records that
	// boundary and resumes the session (usable again) or reports the
	// conversation unrecoverable (LOST). Nothing is replayed.
	ConversationQuarantined = "quarantined"
	// ConversationDeleted: its owner deleted it (S3). It takes no new
	// message (410 gone), and the host holding its sandbox removes the
	// sandbox on this answer from the cluster it pinned (K8).
	ConversationDeleted = "deleted"
)

// Outcomes a runner reports in FinishRequest.Outcome.
const (
	OutcomeSucceeded = "succeeded" // settled; needs a recorded settlement
	OutcomeFailed    = "failed"    // the turn failed; if admitted and unsettled, the conversation is quarantined (K13)
	OutcomeCancelled = "cancelled" // stopped on the user's cancel
	// OutcomeWorkerLost is reported by a restarted daemon for an attempt whose
	// child died with it. Never admitted: the job is queued again and the
	// attempt is not counted (P6). Admitted: the conversation is quarantined (K13).
	OutcomeWorkerLost = "worker_lost"
	// OutcomeReportMissing is never reported by a runner: the control
	// plane ends a job with it when the turn's settlement was recorded but
	// its finish never arrived (K2). The job succeeded at the recorded
	// boundary; only the runner's final report is missing.
	OutcomeReportMissing = "report_missing"
)

// ---- user API ----

// CreateConversationRequest is POST /v1/conversations.
type CreateConversationRequest struct {
	Title        string   `json:"title,omitempty"`
	Image        string   `json:"image"`         // sandbox image (docker backend); informational for process
	AgentCommand []string `json:"agent_command"` // argv of the agent, run in the workspace
	// Sandbox is the backend the conversation needs, SandboxDocker or
	// SandboxProcess; it becomes the requirement sandbox=<it>, so that no
	// host of the other backend is given its turns. Empty: any backend.
	Sandbox string `json:"sandbox,omitempty"`
	// Requires are labels a host must have to be given the conversation's
	// turns (at most MaxLabels, with the sandbox's).
	Requires Labels `json:"requires,omitempty"`
	// AgentProtocol is how the supervisor speaks to the agent:
	// AgentProtocolLines (the default) or AgentProtocolACP.
	AgentProtocol string `json:"agent_protocol,omitempty"`
	// PermissionPolicy answers an ACP agent's permission requests:
	// PermissionAllow, PermissionReject or PermissionAsk (the default for
	// ACP). Not applicable to lines, which must leave it empty.
	PermissionPolicy string `json:"permission_policy,omitempty"`
	// Limits bound the conversation's sandbox (CheckLimits); fixed at
	// creation. Zero fields: the host's own limits.
	Limits Limits `json:"limits,omitzero"`
}

// Agent protocols of a conversation (CreateConversationRequest.AgentProtocol).
const (
	AgentProtocolLines = "lines" // the prompt on stdin, JSON lines on stdout, one process per turn
	AgentProtocolACP   = "acp"   // the Agent Client Protocol over the agent's stdio, one process per conversation
)

// Permission policies of an ACP conversation.
const (
	PermissionAllow  = "allow"  // the first allow option
	PermissionReject = "reject" // a reject option
	PermissionAsk    = "ask"    // the owner answers through the control plane
)

// CheckAgentProtocol returns the protocol and policy a conversation is
// created with, defaults filled in, or which field is wrong.
func CheckAgentProtocol(protocol, policy string) (string, string, error) {
	switch protocol {
	case "", AgentProtocolLines:
		if policy != "" {
			return "", "", fmt.Errorf("permission_policy applies only to agent_protocol %q", AgentProtocolACP)
		}
		return AgentProtocolLines, "", nil
	case AgentProtocolACP:
	default:
		return "", "", fmt.Errorf("agent_protocol must be %q or %q", AgentProtocolLines, AgentProtocolACP)
	}
	switch policy {
	case "":
		return protocol, PermissionAsk, nil
	case PermissionAllow, PermissionReject, PermissionAsk:
		return protocol, policy, nil
	}
	return "", "", fmt.Errorf("permission_policy must be %q, %q or %q", PermissionAllow, PermissionReject, PermissionAsk)
}

// Conversation is one retained agent session.
type Conversation struct {
	ID           string   `json:"id"`
	Title        string   `json:"title,omitempty"`
	Image        string   `json:"image"`
	AgentCommand []string `json:"agent_command"`
	State        string   `json:"state"`                 // usable | quarantined | lost | deleted
	LostReason   string   `json:"lost_reason,omitempty"` // plain language (R32)
	// InterruptedJobID names, while the conversation is quarantined, the
	// turn that was interrupted (K13); its reason says so in plain words.
	InterruptedJobID string    `json:"interrupted_job_id,omitempty"`
	ContainerID      string    `json:"container_id,omitempty"`
	Epoch            int64     `json:"workspace_epoch"`
	NativeTurn       int64     `json:"native_turn"`
	CreatedAt        time.Time `json:"created_at"`
	// SandboxHost names the host that holds the retained sandbox: the host
	// whose attempt last recorded ContainerID. Only that host is given the
	// conversation's turns; empty means any host.
	SandboxHost string `json:"sandbox_host,omitempty"`
	// SandboxState is the state of that sandbox as its host last reported
	// it (S1): SandboxRunning, or SandboxStopped after an idle or pressure
	// eviction (its next message starts it again); "" while none is
	// recorded.
	SandboxState string `json:"sandbox_state,omitempty"`
	// Requires are the labels a host must have to take its turns: the
	// request's, with sandbox=<Sandbox> when it named one.
	Requires         Labels `json:"requires,omitempty"`
	AgentProtocol    string `json:"agent_protocol"`
	PermissionPolicy string `json:"permission_policy,omitempty"`
	Limits           Limits `json:"limits,omitzero"`
}

// ConversationList is GET /v1/conversations.
type ConversationList struct {
	Conversations []Conversation `json:"conversations"`
}

// JobList is GET /v1/jobs: one page of jobs, newest first, each with its
// attempts and without its events; NextCursor, when set, is the cursor
// query parameter of the next page.
type JobList struct {
	Jobs       []Job  `json:"jobs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// SendMessageRequest is POST /v1/conversations/{id}/messages: it enqueues a turn.
type SendMessageRequest struct {
	Prompt string `json:"prompt"`
}

// Job is one turn of a conversation, as the user API shows it.
type Job struct {
	ID             string `json:"id"`
	ConversationID string `json:"conversation_id"`
	Seq            int64  `json:"seq"` // turn number within the conversation, from 1
	State          string `json:"state"`
	Outcome        string `json:"outcome,omitempty"`
	Reason         string `json:"reason,omitempty"` // plain language
	// Cause is why the failed, cancelled or lost turn ended (S5) and
	// CauseEvidence what it was read from, as its last attempt reported
	// them (host_lost when the reaper ended it unreported).
	Cause           Cause  `json:"cause,omitempty"`
	CauseEvidence   string `json:"cause_evidence,omitempty"`
	CancelRequested bool   `json:"cancel_requested"`
	AttemptCount    int    `json:"attempt_count"`     // counted attempts
	WorkerLostCount int    `json:"worker_lost_count"` // uncounted host losses (P6)
	// ReleaseCount counts the releases and declines of the job (K7): turns
	// handed back because the host's child never accepted them. Past the
	// control plane's cap the job fails; ReleaseClass is the last one's
	// class (e.g. "declined:agent_missing").
	ReleaseCount int    `json:"release_count"`
	ReleaseClass string `json:"release_class,omitempty"`
	// NotBefore is set while a released job waits out its release backoff:
	// no host is given it before then.
	NotBefore *time.Time `json:"not_before,omitempty"`
	Admitted  bool       `json:"admitted"`
	CreatedAt time.Time  `json:"created_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Attempts  []Attempt  `json:"attempts"`
	Events    []JobEvent `json:"events,omitempty"`
	// Prompt is the message of the turn; empty once its detail was reclaimed.
	Prompt string `json:"prompt,omitempty"`
	// DetailReclaimedAt is set once the retention window reclaimed the
	// job's detail (P8): the prompt, the runner's report and the data of
	// runner events are gone; states, counts and the timeline stay.
	DetailReclaimedAt *time.Time `json:"detail_reclaimed_at,omitempty"`
	// Unroutable is set on a queued job that no live host can take, as the
	// control plane's last sweep found; the job stays queued and is given
	// to the first host that meets its conversation's requirements.
	Unroutable *Unroutable `json:"unroutable,omitempty"`
	// PendingPermissions are the ACP permission requests of the running
	// turn that wait for the owner's answer (POST
	// /v1/jobs/{job}/permissions/{request}), oldest first.
	PendingPermissions []PermissionRequest `json:"pending_permissions,omitempty"`
}

// PermissionRequest is an ACP agent's session/request_permission waiting
// for the owner, as its "permission_requested" event told it.
type PermissionRequest struct {
	RequestID string             `json:"request_id"`
	AttemptID string             `json:"attempt_id,omitempty"`
	Time      time.Time          `json:"time"`
	ToolCall  json.RawMessage    `json:"tool_call,omitempty"`
	Options   []PermissionOption `json:"options"`
}

// PermissionOption is one answer the agent offers: ACP's PermissionOption.
type PermissionOption struct {
	OptionID string `json:"optionId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
}

// PermissionAnswer is the body of POST /v1/jobs/{job}/permissions/{request}.
type PermissionAnswer struct {
	OptionID string `json:"option_id"`
}

// Job event types of an image pull (runner events, `runnerd run --pull`):
// the sandbox's image was pulled to create it (data: image, duration_ms),
// or could not be had, which fails the turn before admission (data: image,
// duration_ms, reason).
const (
	EventImagePulled     = "image_pulled"
	EventImagePullFailed = "image_pull_failed"
)

// Job event types of an ACP permission request: the supervisor's request
// and its answer (runner events), and the owner's answer as the control
// plane recorded it (a control event).
const (
	EventPermissionRequested = "permission_requested"
	EventPermissionAnswered  = "permission_answered"
	EventPermissionAnswer    = "permission_answer"
)

// Unroutable says why no live host can take a queued job.
type Unroutable struct {
	// Missing are the required labels ("key=value") that the live host
	// closest to the requirements lacks; empty when no host is live.
	Missing []string  `json:"missing"`
	Since   time.Time `json:"since"`
}

// Attempt is one lease of a job (R19).
type Attempt struct {
	ID              string     `json:"id"`
	Generation      int64      `json:"lease_generation"`
	State           string     `json:"state"`
	LeaseOwner      string     `json:"lease_owner"` // host name
	LeaseExpiresAt  time.Time  `json:"lease_expires_at"`
	ClaimedAt       time.Time  `json:"claimed_at"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	Outcome         string     `json:"outcome,omitempty"`
	ContainerID     string     `json:"container_id,omitempty"`
	ActivationID    string     `json:"activation_id,omitempty"`
	CountsAsAttempt bool       `json:"counts_as_attempt"`
}

// JobEvent is one timestamped record of a job's history: control-plane
// transitions (Source "control") and events uploaded by the runner
// (Source "runner").
type JobEvent struct {
	ID        int64           `json:"id"` // numbered per job from 1, visible in order; use as a cursor
	JobID     string          `json:"job_id"`
	AttemptID string          `json:"attempt_id,omitempty"`
	Time      time.Time       `json:"time"`
	Source    string          `json:"source"`
	Type      string          `json:"type"`
	Data      json.RawMessage `json:"data,omitempty"`
}

// JobEventList is GET /v1/jobs/{id}/events?after=ID&wait_ms=N.
type JobEventList struct {
	Events []JobEvent `json:"events"`
	Ended  bool       `json:"ended"` // the job is terminal and every event was returned
}

// Server is one host as Admin → Servers shows it (R37).
type Server struct {
	Name string `json:"name"`
	// State is one of the Host* states, as of the answer.
	State         string       `json:"state"`
	LastHeartbeat *time.Time   `json:"last_heartbeat,omitempty"`
	Capacity      int          `json:"capacity"`
	Running       int          `json:"running"`
	Draining      bool         `json:"draining"`
	LaunchError   *LaunchError `json:"launch_error,omitempty"`
	Version       string       `json:"version,omitempty"`
	// PausedAt is when an operator paused the host; nil when it claims.
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// PausedBy and PauseReason are who paused it (their token's name) and
	// why, as the audit records it.
	PausedBy    string `json:"paused_by,omitempty"`
	PauseReason string `json:"pause_reason,omitempty"`
	// HeartbeatIntervalMS is the period the host said it heartbeats at
	// (0: it did not say; DefaultHeartbeatInterval is assumed).
	HeartbeatIntervalMS int64 `json:"heartbeat_interval_ms,omitempty"`
	// ClaimsWithheld is the class of the reason the host gave for not
	// claiming, such as "sandbox_unavailable"; "" when it claims.
	ClaimsWithheld string `json:"claims_withheld,omitempty"`
	// Labels are the host's routing labels, as its last heartbeat said.
	Labels Labels `json:"labels,omitempty"`
	// SandboxPressure is, while the host withholds first turns under
	// pressure (S2), what is short; nil otherwise.
	SandboxPressure *SandboxPressure `json:"sandbox_pressure,omitempty"`
	// Instance is the daemon instance whose heartbeats hold the host
	// token; nil when no daemon named its instance.
	Instance *HostInstance `json:"instance,omitempty"`
	// Conflict is the last other instance refused 409 host_token_in_use,
	// while it was refused within the host's offline bound: two daemons
	// present one token.
	Conflict *HostInstance `json:"conflict,omitempty"`
}

// Host states. A host is offline once OfflineAfterIntervals of its
// heartbeat intervals passed without one (or it never sent one), whatever
// it last said; else draining, paused by an operator, or online.
const (
	HostOnline   = "online"
	HostOffline  = "offline"
	HostDraining = "draining"
	HostPaused   = "paused"
)

// OfflineAfterIntervals heartbeat intervals without a heartbeat make a host offline.
const OfflineAfterIntervals = 3

// DefaultHeartbeatInterval is assumed for a host that does not say its own.
const DefaultHeartbeatInterval = 10 * time.Second

// OfflineAfter is how long after its last heartbeat the host is offline.
func (s Server) OfflineAfter() time.Duration {
	every := time.Duration(s.HeartbeatIntervalMS) * time.Millisecond
	if every <= 0 {
		every = DefaultHeartbeatInterval
	}
	return OfflineAfterIntervals * every
}

// HostState is the state of s at now.
func HostState(s Server, now time.Time) string {
	switch {
	case s.LastHeartbeat == nil || now.Sub(*s.LastHeartbeat) > s.OfflineAfter():
		return HostOffline
	case s.Draining:
		return HostDraining
	case s.PausedAt != nil:
		return HostPaused
	}
	return HostOnline
}

// RotateTokenRequest is POST /v1/admin/hosts/{name}/rotate-token. GraceMS
// is how long the host's current token stays valid (default
// DefaultRotateGrace); within it the host picks its new token up from a
// heartbeat answer. 0: the new token replaces the old at once and is
// shown once, for a host whose token is lost or leaked.
type RotateTokenRequest struct {
	GraceMS *int64 `json:"grace_ms,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// HostActionRequest is the body of POST /v1/admin/hosts/{name}/pause,
// resume and remove: the reason the audit records (required for remove).
type HostActionRequest struct {
	Reason string `json:"reason,omitempty"`
}

// LoseRequest is POST /v1/admin/conversations/{id}/lose's body: why the
// conversation is marked LOST (required; the audit records it).
type LoseRequest struct {
	Reason string `json:"reason"`
}

// MaxAuditReason bounds an audit reason, in bytes.
const MaxAuditReason = 1024

// Audit actions, as GET /v1/admin/audit names them.
const (
	AuditHostPause       = "host.pause"
	AuditHostResume      = "host.resume"
	AuditHostRotateToken = "host.rotate_token"
	AuditHostRemove      = "host.remove"
	// A host added by hand (controlplane host add) or registered by a
	// daemon with a registration token (actor "registration:NAME/ID").
	AuditHostAdd      = "host.add"
	AuditHostRegister = "host.register"
	// A conversation marked LOST on an operator's word (reason required).
	AuditConversationLose = "conversation.lose"
	// Tokens: the target is the token's id, never the token.
	AuditUserTokenCreate         = "user_token.create"
	AuditUserTokenRevoke         = "user_token.revoke"
	AuditRegistrationTokenCreate = "registration_token.create"
	AuditRegistrationTokenRevoke = "registration_token.revoke"
)

// AuditActions are every action the audit records, as GET
// /v1/admin/audit's action filter takes them.
var AuditActions = []string{AuditHostAdd, AuditHostRegister, AuditHostPause, AuditHostResume, AuditHostRotateToken, AuditHostRemove,
	AuditConversationLose, AuditUserTokenCreate, AuditUserTokenRevoke, AuditRegistrationTokenCreate, AuditRegistrationTokenRevoke}

// AuditEntry is one admin action: who (the user token's name, never the
// token), what, on which target, when, and why.
type AuditEntry struct {
	ID     string    `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Target string    `json:"target"`
	Reason string    `json:"reason,omitempty"`
}

// AuditList is GET /v1/admin/audit's answer, newest first; NextCursor
// (when set) is the next page's cursor.
type AuditList struct {
	Entries    []AuditEntry `json:"entries"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// DefaultRotateGrace is a rotation's grace when the request names none.
const DefaultRotateGrace = 10 * time.Minute

// HostTokenResponse answers POST /v1/admin/hosts/{name}/rotate-token.
// Without a grace Token is the host's new token, shown once, and the old
// one is refused from then on; with a grace Token is empty (nobody but the
// host ever sees its new token) and the old one is refused from GraceUntil.
type HostTokenResponse struct {
	Name       string     `json:"name"`
	Token      string     `json:"token,omitempty"`
	GraceUntil *time.Time `json:"grace_until,omitempty"`
}

// RegisterRequest is POST /v1/agent/register, with a registration token:
// a daemon registers itself under Name with the operator labels it will
// carry (each granted by the token) and gets its own host token.
type RegisterRequest struct {
	Name    string `json:"name"`
	Labels  Labels `json:"labels,omitempty"`
	Version string `json:"version,omitempty"`
}

// RegisterResponse answers a registration: the host's own token, shown
// this once. The registration token plays no further part.
type RegisterResponse struct {
	Name      string `json:"name"`
	HostToken string `json:"host_token"`
}

// ServerList is GET /v1/admin/servers.
type ServerList struct {
	Servers []Server `json:"servers"`
}

// ---- worker API: host scope ----

// ClaimRequest is POST /v1/agent/worker/claim (host token). The control
// plane holds the request up to WaitMS for a job and answers 204 if none came.
type ClaimRequest struct {
	WaitMS     int64 `json:"wait_ms"`      // long-poll bound; the server caps it
	LeaseTTLMS int64 `json:"lease_ttl_ms"` // the lease the runner asks for; 0 = server default
	// IdempotencyKey, chosen by the host at random for each claim and sent
	// again only when the answer never came, makes the claim repeatable:
	// the same key from the same host, while the attempt it created runs
	// and its lease holds, gets that attempt again, worker token included.
	// It is a secret like the host token (the worker token derives from
	// it): never logged. Empty: every 200 is a new attempt.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// MaxClaims is how many turns the host takes at most in this one
	// request: its free slots. 0 (omitted) or 1 asks for one turn,
	// answered with one Claim, the shape every control plane answers; 2
	// to MaxClaimsPerRequest ask for a batch, answered with a ClaimBatch.
	// A control plane older than batches refuses the field with 400
	// unknown_field.
	MaxClaims int `json:"max_claims,omitempty"`
	// PinnedOnly asks only for turns of conversations whose sandbox is
	// recorded on this host — no conversation's first turn — while the
	// host is under pressure (S2, HostHeartbeat.SandboxPressure). A
	// control plane older than the field refuses it with 400
	// unknown_field.
	PinnedOnly bool `json:"pinned_only,omitempty"`
}

// MaxClaimsPerRequest bounds ClaimRequest.MaxClaims.
const MaxClaimsPerRequest = 64

// ClaimBatch is the 200 answer to a claim with max_claims above 1: one to
// max_claims claims, each its own attempt of its own job — never two of
// one conversation — with its own worker token, lease, generation and
// held_ms. With an idempotency key, the whole batch is what a retry with
// the same key gets again.
type ClaimBatch struct {
	Claims []Claim `json:"claims"`
}

// Bounds of ClaimRequest.IdempotencyKey: at least 128 bits of base32.
const (
	MinIdempotencyKey = 26
	MaxIdempotencyKey = 128
)

// Claim is the 200 answer to a claim.
type Claim struct {
	JobID           string    `json:"job_id"`
	AttemptID       string    `json:"attempt_id"`
	LeaseGeneration int64     `json:"lease_generation"`
	LeaseExpiresAt  time.Time `json:"lease_expires_at"`
	LeaseTTLMS      int64     `json:"lease_ttl_ms"`
	// HeldMS is how long the control plane held the request before it
	// granted the claim, on its own monotonic clock from the request's
	// arrival (K4). The lease began no earlier than the request's send
	// plus HeldMS, so the runner counts it from there: a long poll does
	// not shorten the lease.
	HeldMS int64 `json:"held_ms"`
	// QueuedMS is how long the turn waited between its message and this
	// claim, in milliseconds on the store's clock (the job's creation to
	// the claim): the host's queue-wait histogram. nil from a control
	// plane older than the field.
	QueuedMS *int64 `json:"queued_ms,omitempty"`
	// Replayed says this is the answer of an earlier claim with the same
	// idempotency key, whose answer the host never received: the same
	// attempt, generation, expiry, hold and worker token.
	Replayed    bool   `json:"replayed,omitempty"`
	WorkerToken string `json:"worker_token"` // this attempt only; never logged
	// ClusterID is the cluster identity of the control plane that granted
	// the claim (K8): the host records it with a sandbox it creates for
	// the turn, and judges that sandbox only by this cluster's answers.
	// "" from a control plane older than the field.
	ClusterID string `json:"cluster_id,omitempty"`
	Turn      Turn   `json:"turn"`
}

// Held is HeldMS as a duration; a negative value counts as zero.
func (c Claim) Held() time.Duration {
	return time.Duration(max(c.HeldMS, 0)) * time.Millisecond
}

// Turn is what the child needs to run the turn.
type Turn struct {
	ConversationID string   `json:"conversation_id"`
	Seq            int64    `json:"seq"`
	Prompt         string   `json:"prompt"`
	Image          string   `json:"image"`
	AgentCommand   []string `json:"agent_command"`
	// AgentProtocol is the conversation's (AgentProtocolLines when empty:
	// a control plane of an earlier release sends none).
	AgentProtocol    string `json:"agent_protocol,omitempty"`
	PermissionPolicy string `json:"permission_policy,omitempty"`
	ContainerID      string `json:"container_id,omitempty"` // last recorded retained sandbox
	Epoch            int64  `json:"workspace_epoch"`        // last settled boundary
	NativeTurn       int64  `json:"native_turn"`
	// Limits are the conversation's (zero: none of its own, or a control
	// plane of an earlier release); the host applies each, never above
	// its own flag's, when it creates the sandbox.
	Limits Limits `json:"limits,omitzero"`
	// Quarantined: the conversation's last admitted turn was interrupted
	// without a recorded settlement (K13). The turn resumes only the exact
	// retained container ContainerID and a native turn boundary of
	// NativeTurn (the interrupted turn never reached the agent) or
	// NativeTurn+1 (it did), which it records with the container
	// (ContainerRequest.Resumed) before admission; anything else is
	// reported unrecoverable.
	Quarantined bool `json:"quarantined,omitempty"`
	// InterruptedActivationID is, for a quarantined conversation, the
	// supervisor activation the interrupted turn was admitted under: the
	// supervisor must retain the record of exactly that activation at the
	// boundary it reads (K13), or the conversation is unrecoverable.
	InterruptedActivationID string `json:"interrupted_activation_id,omitempty"`
}

// LaunchError is the host's run of consecutive launch failures (R37).
type LaunchError struct {
	Class       string    `json:"class"`
	Consecutive int       `json:"consecutive"`
	Since       time.Time `json:"since"`
}

// HostHeartbeat is POST /v1/agent/worker/heartbeat (host token).
type HostHeartbeat struct {
	Capacity    int          `json:"capacity"`
	Running     int          `json:"running"`
	Draining    bool         `json:"draining"`
	LaunchError *LaunchError `json:"launch_error,omitempty"`
	Version     string       `json:"version,omitempty"`
	// IntervalMS is the period of the host's heartbeats, from which the
	// control plane tells when it is offline.
	IntervalMS int64 `json:"interval_ms,omitempty"`
	// ClaimsWithheld is the class of the reason the host does not claim
	// now, such as "sandbox_unavailable"; "" when it claims.
	ClaimsWithheld string `json:"claims_withheld,omitempty"`
	// Labels are the host's routing labels, its automatic ones (sandbox,
	// os, arch) included; each heartbeat replaces the last one's.
	Labels Labels `json:"labels,omitempty"`
	// SandboxPressure is set while the host is short of disk or memory
	// and, having stopped every idle sandbox it could, still is: it takes
	// no conversation's first turn (ClaimRequest.PinnedOnly), while the
	// turns of conversations already here still run (S2).
	SandboxPressure *SandboxPressure `json:"sandbox_pressure,omitempty"`
}

// SandboxPressure is what a host under pressure is short of (S2).
type SandboxPressure struct {
	Resource     string    `json:"resource"` // PressureDisk or PressureMemory
	FreeBytes    int64     `json:"free_bytes"`
	TotalBytes   int64     `json:"total_bytes"`
	MinFreeBytes int64     `json:"min_free_bytes"` // the host's --min-free-disk or --min-free-memory, in bytes
	Since        time.Time `json:"since"`
}

// SandboxPressure.Resource values.
const (
	PressureDisk   = "disk"
	PressureMemory = "memory"
)

// HostHeartbeatResponse answers a host heartbeat.
type HostHeartbeatResponse struct {
	ServerTime time.Time `json:"server_time"`
	// ClusterID is the control plane's cluster identity, created with its
	// database (K8). The host pins the first it sees.
	ClusterID string `json:"cluster_id"`
	// HostToken is the host's new token, set only in the answer to a
	// heartbeat sent with its previous token during a rotation's grace:
	// the host stores it and uses only it from then on. Never logged.
	HostToken string `json:"host_token,omitempty"`
}

// MaxConversationIDs bounds the ids of one ConversationStatesRequest.
const MaxConversationIDs = 1000

// ConversationUnknown is the state of an id the control plane does not
// have: never created here (a deleted conversation is ConversationDeleted). Only ConversationStatesResponse uses it.
const ConversationUnknown = "unknown"

// ConversationStatesRequest is POST /v1/agent/worker/conversations (host
// token): the host asks which of the conversations it holds sandboxes for
// may still run a turn.
type ConversationStatesRequest struct {
	ConversationIDs []string `json:"conversation_ids"` // at most MaxConversationIDs
	// SandboxStates reports, for asked conversations whose sandbox state
	// the host knows, SandboxRunning or SandboxStopped (S1); the control
	// plane records it for those whose sandbox is recorded on this host
	// (Conversation.SandboxState). Absent ids are not known. A control
	// plane older than the field refuses it with 400 unknown_field.
	SandboxStates map[string]string `json:"sandbox_states,omitempty"`
}

// Sandbox states (Conversation.SandboxState, ConversationStatesRequest).
const (
	SandboxRunning = "running"
	SandboxStopped = "stopped"
)

// ConversationState is one conversation's state as the host sees it.
type ConversationState struct {
	ID    string `json:"id"`
	State string `json:"state"` // usable | quarantined | lost | deleted | unknown
	// Sandbox says where the conversation's retained sandbox is recorded,
	// as seen from the asking host: SandboxThisHost, SandboxOtherHost, or
	// "" while none is recorded (and from a control plane older than the
	// field). Turns go to the recorded host only, so a host told
	// SandboxOtherHost runs no turn of the conversation again.
	Sandbox string `json:"sandbox,omitempty"`
	// SandboxHost names the host the sandbox is recorded on, for records.
	SandboxHost string `json:"sandbox_host,omitempty"`
}

// ConversationState.Sandbox values.
const (
	SandboxThisHost  = "this_host"
	SandboxOtherHost = "other_host"
)

// ConversationStatesResponse answers with one entry per distinct id asked
// for, in the order asked.
type ConversationStatesResponse struct {
	Conversations []ConversationState `json:"conversations"`
	// ClusterID is the identity of the database that answered (K8): a
	// host removes a sandbox only on a LOST or deleted answer carrying the identity
	// it pinned.
	ClusterID string `json:"cluster_id"`
}

// MaxCancelWatch bounds the attempt ids of one CancelsRequest.
const MaxCancelWatch = 1000

// CancelsRequest is POST /v1/agent/worker/cancels (host token): a long
// poll that carries the user's cancels to the host within about a poll
// period of the control plane instead of one renewal interval (K10). The
// control plane holds it up to WaitMS (capped as a claim's) until one of
// AttemptIDs — running attempts of this host — has its job's cancel
// requested, and answers 204 if none has. The renewal answer stays the
// fallback (P7).
type CancelsRequest struct {
	AttemptIDs []string `json:"attempt_ids"` // 1 to MaxCancelWatch ids
	WaitMS     int64    `json:"wait_ms"`
}

// CancelsResponse is the 200 answer: the attempts among those asked for
// that are running on this host and whose job's cancel was requested.
type CancelsResponse struct {
	AttemptIDs []string `json:"attempt_ids"`
}

// ---- worker API: attempt scope (worker token) ----

// PermissionsRequest is the turn child's long poll for the owner's answer
// to its permission request RequestID, held up to WaitMS.
type PermissionsRequest struct {
	AttemptRef
	RequestID string `json:"request_id"`
	WaitMS    int64  `json:"wait_ms,omitempty"`
}

// PermissionsResponse is its 200 answer: the option the owner chose (a
// 204 says none yet).
type PermissionsResponse struct {
	OptionID string `json:"option_id"`
}

// AttemptRef names the attempt and its fencing token (P1) in every
// attempt-scoped body.
type AttemptRef struct {
	AttemptID       string `json:"attempt_id"`
	LeaseGeneration int64  `json:"lease_generation"`
}

// RenewRequest is POST .../renew.
type RenewRequest struct {
	AttemptRef
	LeaseTTLMS int64 `json:"lease_ttl_ms"`
}

// RenewResponse carries the new expiry and the cancel flag (P7).
type RenewResponse struct {
	LeaseExpiresAt  time.Time `json:"lease_expires_at"`
	LeaseTTLMS      int64     `json:"lease_ttl_ms"`
	CancelRequested bool      `json:"cancel_requested"`
}

// Event is one runner event in an upload batch. Seq is per attempt and
// increasing; a batch repeated after a lost answer is harmless.
type Event struct {
	Seq  int64           `json:"seq"`
	Time time.Time       `json:"time"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
}

// EventsRequest is POST .../events.
type EventsRequest struct {
	AttemptRef
	Events []Event `json:"events"`
}

// EventsResponse says the highest sequence number stored for the attempt.
type EventsResponse struct {
	StoredThrough int64 `json:"stored_through"`
}

// ContainerRequest is POST .../container: the retained sandbox's identity,
// recorded before admission (R29).
type ContainerRequest struct {
	AttemptRef
	Backend     string `json:"backend"` // process | docker
	ContainerID string `json:"container_id"`
	// Resumed is sent by the turn of a quarantined conversation (K13)
	// once it verified the retained container and the supervisor's native
	// turn boundary: the control plane records that boundary and the
	// conversation is usable again. The same request again is a no-op.
	Resumed *ResumedBoundary `json:"resumed,omitempty"`
}

// ResumedBoundary is the verified boundary a quarantined conversation
// resumes from (K13).
type ResumedBoundary struct {
	NativeTurn int64 `json:"native_turn"` // the supervisor's recorded native turn
}

// AdmissionRequest is POST .../admission.
type AdmissionRequest struct {
	AttemptRef
	ActivationID string `json:"activation_id"`
}

// AdmissionReceipt is the 200 answer; the same request again gets the same receipt.
type AdmissionReceipt struct {
	ReceiptID      string    `json:"receipt_id"`
	JobID          string    `json:"job_id"`
	ConversationID string    `json:"conversation_id"`
	ActivationID   string    `json:"activation_id"`
	AdmittedAt     time.Time `json:"admitted_at"`
}

// SupervisorReceipt is the sandbox manager's settlement receipt for one
// activation (R26), passed on to the control plane.
type SupervisorReceipt struct {
	ActivationID string `json:"activation_id"`
	ReceiptID    string `json:"receipt_id"`
	NativeTurn   int64  `json:"native_turn"`
	ExitCode     int    `json:"exit_code"`
	// Interrupted says the turn did not end on its own: the supervisor
	// interrupted it on request (the user's cancel, K10) and NativeTurn is
	// the interrupted boundary the next turn resumes from.
	Interrupted bool `json:"interrupted,omitempty"`
}

// SettlementRequest is POST .../settlement.
type SettlementRequest struct {
	AttemptRef
	ActivationID string            `json:"activation_id"`
	Supervisor   SupervisorReceipt `json:"supervisor_receipt"`
}

// Boundary is the recorded settlement (R27); repeating the settlement for
// the same attempt and activation returns the same boundary.
type Boundary struct {
	WorkspaceEpoch int64     `json:"workspace_epoch"`
	SnapshotID     string    `json:"snapshot_id"`
	NativeTurn     int64     `json:"native_turn"`
	SettledAt      time.Time `json:"settled_at"`
}

// NoticeSharedWorkspaceSettled is the only notice kind today (R23).
const NoticeSharedWorkspaceSettled = "shared_workspace_settled"

// NoticeRequest is POST .../notices.
type NoticeRequest struct {
	AttemptRef
	Kind     string   `json:"kind"`
	Boundary Boundary `json:"boundary"`
}

// AbandonRequest is POST .../abandon: a failure before admission with a
// recorded container; the conversation stays usable (R29).
type AbandonRequest struct {
	AttemptRef
	Class  string `json:"class"`
	Reason string `json:"reason,omitempty"`
}

// ReleaseRequest is POST .../release: the child provably never accepted (R33, R36).
type ReleaseRequest struct {
	AttemptRef
	Class string `json:"class"` // spawn_failed | payload_undelivered | declined:<class>
}

// FinishRequest is POST .../finish, the terminal report.
type FinishRequest struct {
	AttemptRef
	Outcome string `json:"outcome"`
	Class   string `json:"class,omitempty"`  // error class for failures
	Reason  string `json:"reason,omitempty"` // operator detail, no secrets
	// Cause is why a failed, cancelled or lost turn ended (S5), with its
	// evidence in plain words (what was read, e.g. "memory cgroup v1
	// memory.oom_control oom_kill 0→1"; at most MaxCauseEvidenceBytes).
	// Absent on a success, and from runners older than the closed list.
	Cause         Cause  `json:"cause,omitempty"`
	CauseEvidence string `json:"cause_evidence,omitempty"`
	// Ambiguous marks an admission whose answer never came (R30): the
	// prompt was not sent and the turn is never requeued. The store judges
	// it by its own record of the admission: none, and the turn failed as
	// not started (the conversation usable); one, and the conversation is
	// quarantined (K13) — never LOST on the missing answer alone.
	Ambiguous bool `json:"admission_ambiguous,omitempty"`
	// Unrecoverable says the retained session is provably gone or not the
	// one the control plane settled (R31: the workspace vanished, or the
	// sandbox's native turn differs from the recorded boundary): the
	// conversation must become LOST rather than fail every later turn.
	Unrecoverable bool `json:"context_unrecoverable,omitempty"`
}

// FinishResponse answers finish and abandon; the same report again gets the
// same answer (P2).
type FinishResponse struct {
	JobState          string    `json:"job_state"`
	ConversationState string    `json:"conversation_state"`
	RecordedAt        time.Time `json:"recorded_at"`
}

// Empty is the body of answers that carry nothing but their status.
type Empty struct{}

// ---- the worker batch ----

// PathWorkerBatch is POST of a WorkerBatch with the host token: many
// attempt-scoped calls of the host's attempts in one request, each
// authorized by its own worker token and answered on its own.
const PathWorkerBatch = "/v1/agent/worker/batch"

// Bounds of a WorkerBatch: at most MaxBatchItems items, the whole body at
// most MaxBatchBodyBytes, each item's body at most MaxBodyBytes (as the
// per-call request's).
const (
	MaxBatchItems     = 256
	MaxBatchBodyBytes = 8 * MaxBodyBytes
)

// BatchOps are the operations a WorkerBatch item may carry: every
// attempt-scoped call but the permission answer's long poll.
var BatchOps = []string{OpRenew, OpEvents, OpContainer, OpAdmission, OpSettlement, OpNotices, OpAbandon, OpRelease, OpFinish}

// WorkerBatch is the body of POST PathWorkerBatch.
type WorkerBatch struct {
	Items []BatchItem `json:"items"`
}

// BatchItem is one attempt-scoped call: what POST AttemptPath(JobID, Op)
// with "Authorization: Bearer WorkerToken" and Body would send.
type BatchItem struct {
	Op          string          `json:"op"`
	JobID       string          `json:"job_id"`
	WorkerToken string          `json:"worker_token"`
	Body        json.RawMessage `json:"body"`
}

// WorkerBatchResponse answers a WorkerBatch: one result per item, in the
// items' order.
type WorkerBatchResponse struct {
	Results []BatchResult `json:"results"`
}

// BatchResult is one item's answer: the status and body the per-call
// endpoint would have answered, and its Retry-After header if it had one.
type BatchResult struct {
	Status     int             `json:"status"`
	RetryAfter string          `json:"retry_after,omitempty"`
	Body       json.RawMessage `json:"body"`
}
