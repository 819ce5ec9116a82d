// Package store is the control plane's single source of truth: one
// interface, Store, with a SQLite and a PostgreSQL implementation that pass
// the same conformance suite. Every rule about jobs, attempts, leases and
// conversations lives here, in SQL, not in handler code.
//
// Only the controlplane packages import store.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Sentinel errors. The HTTP layer maps each to one status and wire code.
var (
	ErrNotFound         = errors.New("not found")                    // 404 not_found
	ErrForbidden        = errors.New("token is for another job")     // 403 forbidden
	ErrOtherAttempt     = errors.New("token is for another attempt") // 403 forbidden
	ErrUnauthorized     = errors.New("unknown token")                // 401 unauthorized
	ErrLeaseLost        = errors.New("lease lost")                   // 409 lease_lost (and a lease.stale_report event)
	ErrAdmitted         = errors.New("job was admitted")             // 409 admitted
	ErrNotAdmitted      = errors.New("job was not admitted")         // 409 not_admitted
	ErrConversationLost = errors.New("conversation is lost")         // 409 conversation_lost
	// ErrConversationBusy: a turn of the conversation runs or waits, so it
	// cannot be deleted; cancel the turn first.
	ErrConversationBusy    = errors.New("a turn of the conversation runs or waits") // 409 conversation_busy
	ErrConversationDeleted = errors.New("conversation is deleted")                  // 410 gone: it takes no new message
	ErrGone                = errors.New("ended for good")                           // 410 gone
	ErrInvalid             = errors.New("invalid")                                  // 400 invalid (wrap with detail)
	ErrExists              = errors.New("already exists")                           // 409 (host names)
	ErrNotPending          = errors.New("permission request is not pending")        // 409 not_pending
	ErrSchemaBehind        = errors.New("schema behind")                            // Ready: a migration of this build is not applied
	// A registration token past its expiry, or one that registered its
	// max_uses hosts already; ErrLabelNotGranted (wrapped, naming the
	// label): a registration asking for a label its token does not grant.
	ErrRegistrationExpired = errors.New("registration token expired")                  // 401 registration_expired
	ErrRegistrationUsedUp  = errors.New("registration token used up")                  // 401 registration_used_up
	ErrHostTokenInUse      = errors.New("host token in use by another live instance")  // 409 host_token_in_use
	ErrLabelNotGranted     = errors.New("label not granted by the registration token") // 403 forbidden
	// ErrKeyTaken: a keyed claim whose key's attempts still run, their
	// leases over but not yet superseded by the reaper. Nothing is
	// claimed; the host's next claim, with a new key, is an ordinary one.
	ErrKeyTaken = errors.New("idempotency key is taken") // 204, the claim answered at once
)

// Release cap and backoff (K7), the defaults of every implementation.
const (
	// DefaultMaxReleases is how many releases (and declines) of one job
	// requeue it; the next one fails the job.
	DefaultMaxReleases = 5
	// DefaultReleaseBackoff is how long a job released once waits before it
	// can be claimed again; it doubles with each further release, up to
	// MaxReleaseBackoff.
	DefaultReleaseBackoff = 5 * time.Second
	MaxReleaseBackoff     = time.Minute
)

// ReleaseBackoff is the wait after the n-th release (from 1) of a job.
func ReleaseBackoff(base time.Duration, n int64) time.Duration {
	d := base
	for i := int64(1); i < n && d < MaxReleaseBackoff; i++ {
		d *= 2
	}
	return min(d, MaxReleaseBackoff)
}

// Instance is the daemon instance a host call names (wire.HeaderInstanceID).
type Instance struct {
	ID, BootID string
	Stopping   bool // the daemon's last heartbeat: it stops
}

// Host is a registered sandbox host.
type Host struct {
	ID   string
	Name string
	// Paused: an operator paused the host; it is given no new claim.
	Paused bool
	// Previous is set when the token presented is the host's previous one,
	// kept through a rotation's grace: the caller refuses it from Until
	// on (judged on the store's clock) and, before, derives the new token
	// from it and Nonce (controlplane.RotatedToken).
	Previous *PreviousToken
}

// PreviousToken is the grace of a rotated host token.
type PreviousToken struct {
	Until time.Time
	Nonce string
}

// HostRotation is how RotateHostToken replaces a host's token: with a
// GraceUntil (not zero), the current token stays valid until then and the
// new one derives from it and Nonce; without, TokenHash replaces it at once.
type HostRotation struct {
	TokenHash  []byte
	Nonce      string
	GraceUntil time.Time
}

// RegistrationToken is a token a daemon registers itself with, as the
// store knows it (never the token, only its hash is kept).
type RegistrationToken struct {
	ID     string
	Name   string
	Labels wire.Labels // the operator labels a host registering with it may carry
	// MaxUses is how many hosts it may register, 0 without a limit; Uses
	// how many it has.
	MaxUses   int
	Uses      int
	ExpiresAt *time.Time // nil: never
	CreatedAt time.Time
	RevokedAt *time.Time
}

// ConversationState is a conversation's state and the host its retained
// sandbox is recorded on (the last RecordContainer's host, which its turns
// are pinned to); SandboxHostID is "" while none is recorded.
type ConversationState struct {
	State         string
	SandboxHostID string
	SandboxHost   string // the host's name
	SandboxState  string // wire.SandboxRunning, wire.SandboxStopped, or "" (none recorded)
}

// RunningTurn is a running attempt as RunningTurns reads it.
type RunningTurn struct {
	JobID     string
	Seq       int64
	Host      string
	ClaimedAt time.Time
}

// Stats is what the control plane's /metrics shows of the store.
type Stats struct {
	JobsByState map[string]int // every job state, zero counts included
	// JobsByCause counts the jobs that ended with a cause (S5), by cause.
	JobsByCause map[wire.Cause]int
	LiveLeases  int // attempts running now
}

// Audit is who asked for an admin action and why: Actor is
// the user token's name (never the token) for the admin API, "cli:USER"
// for a command run against the database, Reason the operator's words.
type Audit struct {
	Actor  string
	Reason string
}

// AuditEntry is one audit row: Action (wire.Audit*) on Target at At.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string
	Target string
	Reason string
}

// AuditFilter selects audit rows: each set field narrows the list. Before
// is a cursor: only rows with a smaller ID. Limit 0 is no limit.
type AuditFilter struct {
	Target string
	Action string
	Since  time.Time
	Before int64
	Limit  int
}

// UserToken is a bearer token of the user API and the admin pages, as the
// store knows it: never the token itself, only its hash is kept.
type UserToken struct {
	ID        string
	Name      string // an operator's label, e.g. who holds it
	CreatedAt time.Time
	RevokedAt *time.Time // nil while the token is accepted
}

// AttemptAuth is what a worker token authorizes: one attempt of one job.
type AttemptAuth struct {
	JobID     string
	AttemptID string
	HostID    string
}

// Worker is who makes an attempt-scoped call: the hash of its worker
// token and the job its request names.
type Worker struct {
	JobID     string
	TokenHash []byte
}

// ClaimParams are the inputs of Claim.
type ClaimParams struct {
	HostID          string
	LeaseTTL        time.Duration
	WorkerTokenHash []byte // hash of the worker token the server generated
	Now             time.Time
	// AttemptID is the new attempt's id when the caller chose it (the
	// server derives a keyed claim's worker token from it); empty means
	// the store picks one.
	AttemptID string
	// KeyHash is the hash of the host's idempotency key, or nil. The same
	// key again from the same host, while the attempts it made run and
	// their leases hold, gets the same attempts back (wire.Claim.Replayed)
	// instead of others: a claim whose answer was lost makes no orphans.
	KeyHash []byte
	// Held is how long the server held the request before this claim
	// (K4); it is kept with the attempt for a replayed answer.
	Held time.Duration
	// More are the turns after the first that the claim may take (batched
	// claims): ClaimMany takes up to 1+len(More) turns, each its own
	// attempt, worker token and lease. With a KeyHash the same key again
	// gets the whole batch back, as it gets one attempt back.
	More []ClaimSlot
	// PinnedOnly takes only turns pinned to this host's sandboxes: no
	// conversation's first turn (S2, a host under pressure).
	PinnedOnly bool
}

// ClaimSlot is a further turn of a batched claim: the new attempt's id
// (empty: the store picks one) and the hash of its worker token.
type ClaimSlot struct {
	AttemptID       string
	WorkerTokenHash []byte
}

// JobFilter selects the jobs of ListJobs; an empty field selects every job.
type JobFilter struct {
	State   string // a wire.Job* state
	Outcome string // a wire.Outcome* of an ended job
	// Class is an error class a runner reported about one of the job's
	// attempts (its finish, abandon or release): letters, digits and _.
	Class          string
	ConversationID string
	// Host is a host name: the jobs one of whose attempts it held the
	// lease of (the attempt's lease_owner).
	Host string
	// Since selects the jobs created at or after it; zero selects all.
	Since time.Time
	// Before is a cursor: only jobs older than the one at that queue
	// position (JobList.Next of the page before); 0 starts at the newest.
	Before int64
	// Limit bounds the answer; 0 or less means DefaultJobListLimit.
	Limit int
}

// JobList is one page of ListJobs: its jobs, newest first, and the cursor
// of the next page (Before of the next filter), 0 when this is the last.
type JobList struct {
	Jobs []wire.Job
	Next int64
}

// DefaultJobListLimit bounds ListJobs when the filter sets no limit.
const DefaultJobListLimit = 100

// ReapParams are the inputs of one reaper sweep.
type ReapParams struct {
	Now time.Time
	// Grace is added to lease expiry before an attempt is superseded; at
	// least the runner's stop grace (P3).
	Grace time.Duration
	// MaxWorkerLost caps the uncounted requeues of one job (P6): past it
	// the job fails with a plain reason instead of looping through the fleet.
	MaxWorkerLost int
	// Limit bounds one sweep; 0 means no limit.
	Limit int
}

// ReapResult counts what one sweep did.
type ReapResult struct {
	Superseded int
	Requeued   int
	// ConversationsQuarantined counts admitted, unsettled turns whose
	// conversation was quarantined (K13), never lost.
	ConversationsQuarantined int
	FailedWorkerLostCap      int
	// ReportsMissing counts settled turns whose finish never arrived,
	// ended as succeeded with outcome report_missing (K2).
	ReportsMissing int
}

// ReclaimParams are the inputs of ReclaimDetail.
type ReclaimParams struct {
	Now time.Time
	// Before is the end of the retention window: jobs that ended before it
	// lose their detail.
	Before time.Time
	// Limit bounds one call, in jobs; 0 means no limit.
	Limit int
}

// Store is the control plane's persistence. Every method takes the current
// time from its caller, so tests control it; a server takes it from Now,
// the store's one clock (K3). Every attempt-scoped write is a
// single guarded statement (attempt id, lease generation, state running,
// lease not expired at Now); a refused one returns ErrLeaseLost and records
// a lease.stale_report event on the job (P1).
type Store interface {
	// Now reads the store's one clock, on which every lease, expiry,
	// reaping and absence is judged (K3): the database's on PostgreSQL,
	// so that replicas whose own clocks differ agree; the process's on
	// SQLite, where the one process is the one clock.
	Now(ctx context.Context) (time.Time, error)

	// Hosts.
	// CreateHost adds a host by hand (controlplane host add), writing a's
	// audit row (host.add) in its transaction.
	CreateHost(ctx context.Context, name string, tokenHash []byte, a Audit, now time.Time) (Host, error)
	HostByTokenHash(ctx context.Context, tokenHash []byte) (Host, error) // ErrUnauthorized
	RecordHostHeartbeat(ctx context.Context, hostID string, hb wire.HostHeartbeat, now time.Time) error
	// UseHostInstance lets the daemon instance in act for the host, or
	// refuses it ErrHostTokenInUse (recording it as the host's conflict)
	// while another instance is live: that one's last heartbeat is within
	// the host's offline bound (wire.Server.OfflineAfter), it did not say
	// it stops, and in's boot id is not its own (the same machine's boot:
	// a restart or a handover, never refused). beat: a heartbeat, which
	// marks in live as of now; a claim only checks (or takes over).
	UseHostInstance(ctx context.Context, hostID string, in Instance, beat bool, now time.Time) error
	// ListServers lists the hosts not removed, by name; State is left for
	// the caller, who knows the time (wire.HostState).
	ListServers(ctx context.Context) ([]wire.Server, error)
	// RunningTurns lists the running attempts, each with its job's turn
	// number and the name of the host holding it (Admin → Servers'
	// current turns), by host name, oldest claim first.
	RunningTurns(ctx context.Context) ([]RunningTurn, error)
	// PauseHost pauses (or resumes) the named host: a paused host is given
	// no new claim, its running turns go on. RemoveHost refuses the host's
	// token from then on and drops it from ListServers; its attempts keep
	// naming it, and CreateHost of its name registers it anew.
	// RotateHostToken replaces the token; the old one is refused from then
	// on. Each returns ErrNotFound for a name no live host has.
	// Each writes a's audit row in the action's transaction:
	// an action that returns an error writes none.
	PauseHost(ctx context.Context, name string, paused bool, a Audit, now time.Time) error
	RemoveHost(ctx context.Context, name string, a Audit, now time.Time) error
	// With a grace the current token stays valid until its end (Host.Previous).
	RotateHostToken(ctx context.Context, name string, r HostRotation, a Audit, now time.Time) error
	// ListAudit lists the audit rows f selects, newest first.
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEntry, error)
	// AdoptRotatedToken makes newHash the token of the host whose previous
	// token is previousHash (the host derived its new token); again with
	// the same hashes is a no-op. ErrNotFound if no live host matches.
	AdoptRotatedToken(ctx context.Context, hostID string, previousHash, newHash []byte) error

	// Registration tokens. RegisterHost registers the host name with its
	// own token in one transaction, counting a use of the registration
	// token: ErrUnauthorized for an unknown or revoked one,
	// ErrRegistrationExpired, ErrRegistrationUsedUp, ErrLabelNotGranted,
	// ErrExists for a name a live host has; nothing is written on an error.
	// Create, revoke and register each write their audit row in their
	// transaction (a registration's actor: "registration:NAME/ID", the
	// registration token's); revoking a revoked token writes none.
	CreateRegistrationToken(ctx context.Context, t RegistrationToken, tokenHash []byte, a Audit, now time.Time) (RegistrationToken, error)
	ListRegistrationTokens(ctx context.Context) ([]RegistrationToken, error)
	RevokeRegistrationToken(ctx context.Context, id string, a Audit, now time.Time) (RegistrationToken, error)
	RegisterHost(ctx context.Context, registrationHash []byte, name string, labels wire.Labels, hostTokenHash []byte, now time.Time) (Host, error)

	// Stats counts jobs by state and live leases. Ready returns nil when
	// the database answers and every migration this build knows is applied.
	Stats(ctx context.Context) (Stats, error)
	Ready(ctx context.Context) error

	// User tokens, kept in the database so that every replica accepts the
	// same ones. UserTokenByHash returns a token revoked or not (the
	// caller refuses a revoked one); ErrUnauthorized if none has the hash.
	// Create and revoke write a's audit row in their transaction;
	// revoking a revoked token writes none.
	CreateUserToken(ctx context.Context, name string, tokenHash []byte, a Audit, now time.Time) (UserToken, error)
	UserTokenByHash(ctx context.Context, tokenHash []byte) (UserToken, error)
	// ListUserTokens lists every token ever created, revoked ones
	// included, oldest first.
	ListUserTokens(ctx context.Context) ([]UserToken, error)
	// RevokeUserToken refuses the token from now on, on every replica;
	// revoking it again keeps the first time. ErrNotFound if none has the id.
	RevokeUserToken(ctx context.Context, id string, a Audit, now time.Time) (UserToken, error)

	// User API.
	CreateConversation(ctx context.Context, req wire.CreateConversationRequest, now time.Time) (wire.Conversation, error)
	GetConversation(ctx context.Context, id string) (wire.Conversation, error)
	// ConversationStates reads the states of the conversations ids names,
	// with the host their sandbox is recorded on, in one query; an id the
	// store does not hold has no entry.
	ConversationStates(ctx context.Context, ids []string) (map[string]ConversationState, error)
	// RecordSandboxStates records the sandbox states (wire.SandboxRunning,
	// wire.SandboxStopped) a host reported for conversations whose sandbox
	// is recorded on it; the others' are left as they are (S1).
	RecordSandboxStates(ctx context.Context, hostID string, states map[string]string) error
	ListConversations(ctx context.Context) ([]wire.Conversation, error)
	// ConversationTitles reads the titles of the conversations ids names,
	// in one query; an id the store does not hold has no entry.
	ConversationTitles(ctx context.Context, ids []string) (map[string]string, error)
	// EnqueueTurn appends a turn; ErrConversationLost for a LOST
	// conversation (R32), ErrConversationDeleted for a deleted one (S3).
	EnqueueTurn(ctx context.Context, conversationID, prompt string, now time.Time) (wire.Job, error)
	// GetJob returns the job with its attempts and events.
	GetJob(ctx context.Context, id string) (wire.Job, error)
	// ListJobs lists the jobs f selects, newest first, each with its
	// attempts but not its events (Admin → Jobs).
	ListJobs(ctx context.Context, f JobFilter) (JobList, error)
	// JobEvents returns events numbered above after, in order, at most
	// limit. Events are numbered per job from 1, and a job's events become
	// visible in the order of their numbers, so a follower paging by the
	// last number it saw sees every event once.
	JobEvents(ctx context.Context, jobID string, after int64, limit int) ([]wire.JobEvent, error)
	// LoseConversation marks a conversation LOST on an operator's word,
	// for when the host holding its sandbox is gone for good: its queued
	// turns fail, with plain reasons (R32), and it takes no new message.
	// A LOST conversation is returned as it is. ErrInvalid while a turn of
	// it runs: that turn's lease decides first (R30, R35).
	// It writes a's audit row in its transaction (a reason is required);
	// a conversation LOST or deleted already writes none.
	LoseConversation(ctx context.Context, id string, a Audit, now time.Time) (wire.Conversation, error)
	// DeleteConversation marks a conversation deleted on its owner's word
	// (S3): it takes no new message, and the host holding its sandbox
	// removes it on the cluster's answer (K8); P8's retention reclaims its
	// turns' detail as for any ended turn. ErrConversationBusy while a turn
	// of it runs or waits (cancel it first). A deleted conversation is
	// returned as it is.
	DeleteConversation(ctx context.Context, id string, now time.Time) (wire.Conversation, error)
	// CancelJob ends a queued job at once; for a running one it sets the
	// cancel flag that the next renewal answer carries (P7). ErrGone if ended.
	CancelJob(ctx context.Context, id string, now time.Time) (wire.Job, error)
	// AnswerPermission records the owner's answer optionID to the running
	// turn's pending permission request requestID (PendingPermissions) as a
	// "permission_answer" event, once. ErrNotFound for no such job,
	// ErrNotPending when the request is not pending (answered, timed out,
	// its turn over, or never asked), ErrInvalid for an option the request
	// did not offer.
	AnswerPermission(ctx context.Context, jobID, requestID, optionID string, now time.Time) error
	// PermissionAnswer is the option the owner chose for the attempt's
	// permission request requestID, "" while none is recorded.
	PermissionAnswer(ctx context.Context, jobID, attemptID, requestID string) (string, error)

	// Worker API, host scope. Claim takes the oldest runnable job: queued,
	// past its release backoff (K7), of a conversation that is usable and
	// has no other job running or queued before it (one turn at a time, in
	// order), and whose retained
	// sandbox is on this host or not recorded yet (host affinity: the
	// sandbox lives on the host whose attempt last called RecordContainer).
	// Of the conversations with no sandbox yet it takes only those whose
	// required labels (wire.Conversation.Requires) the host has, as its
	// last heartbeat said (routing, issue 13 §1).
	// It returns false when there is none. The new attempt's generation is
	// one more than the job's last (P1).
	Claim(ctx context.Context, p ClaimParams) (wire.Claim, bool, error)
	// ClaimMany is Claim for up to 1+len(p.More) turns at once, in queue
	// order, the first with p's attempt id and worker token hash, the
	// others with p.More's in order: one statement on PostgreSQL. Each
	// keeps what Claim keeps — never two of one conversation, each past
	// its backoff, on its route, for an open host. None runnable is no
	// error. A replay (p.KeyHash) answers every live attempt of the key.
	ClaimMany(ctx context.Context, p ClaimParams) ([]wire.Claim, error)
	// WorkSignal returns a channel that is closed once a job may have
	// become claimable since the call — queued as the head of its
	// conversation (enqueued, released, requeued, its conversation's
	// previous turn ended), a host resumed or its labels changed — by any
	// replica sharing the store: PostgreSQL's LISTEN/NOTIFY, or an
	// in-process signal on SQLite. It may close for nothing; it does not
	// close when a release backoff (K7) ends, which a waiter finds by
	// trying again now and then.
	WorkSignal() <-chan struct{}
	// CancelsRequested returns those of attemptIDs that are running
	// attempts of hostID whose job's cancel was requested (K10: the host's
	// fast path to a cancel; the renewal answer is the other).
	CancelsRequested(ctx context.Context, hostID string, attemptIDs []string) ([]string, error)
	// SweepRoutes judges every requirement set against the labels of the
	// hosts online at now: a queued job that none of them can take shows
	// wire.Job.Unroutable (the labels the closest host lacks) until a
	// later sweep finds a host that meets it. It returns how many
	// requirement sets are unroutable.
	SweepRoutes(ctx context.Context, now time.Time) (int, error)

	// AuthorizeAttempt maps a worker token hash to its attempt, checking
	// that it belongs to jobID: ErrUnauthorized if no attempt has it,
	// ErrForbidden if it is another job's, ErrNotFound if jobID does not exist.
	AuthorizeAttempt(ctx context.Context, jobID string, tokenHash []byte) (AttemptAuth, error)

	// Attempt scope: each is one guarded statement (P1).
	Renew(ctx context.Context, ref wire.AttemptRef, ttl time.Duration, now time.Time) (wire.RenewResponse, error)
	// RenewAs is Renew for the worker w, its authorization in the same
	// guarded statement: one round trip to PostgreSQL when the lease is
	// renewed. The zero now is the store's own clock, read inside the
	// statement (K3). A refusal is AuthorizeAttempt's, ErrOtherAttempt
	// when the token is another attempt's, or Renew's.
	RenewAs(ctx context.Context, w Worker, ref wire.AttemptRef, ttl time.Duration, now time.Time) (wire.RenewResponse, error)
	AppendEvents(ctx context.Context, ref wire.AttemptRef, events []wire.Event, now time.Time) (wire.EventsResponse, error)
	// AppendEventsAs, AdmitAs, SettleAs and FinishAs are AppendEvents,
	// Admit, Settle and Finish for the worker w, as RenewAs is Renew: the
	// authorization in the guarded statement, the zero now the store's
	// own clock. On PostgreSQL each is one round trip in its common case
	// (events whose seqs are new, a first admission, a first settlement
	// not interrupted), a succeeded finish two; the same refusals as
	// RenewAs's.
	AppendEventsAs(ctx context.Context, w Worker, ref wire.AttemptRef, events []wire.Event, now time.Time) (wire.EventsResponse, error)
	AdmitAs(ctx context.Context, w Worker, ref wire.AttemptRef, activationID string, now time.Time) (wire.AdmissionReceipt, error)
	SettleAs(ctx context.Context, w Worker, ref wire.AttemptRef, req wire.SettlementRequest, now time.Time) (wire.Boundary, error)
	FinishAs(ctx context.Context, w Worker, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) (wire.FinishResponse, error)
	// RecordContainer records the retained sandbox on the attempt and the
	// conversation, and the attempt's host as the sandbox's host. For a
	// quarantined conversation it needs req.Resumed, the exact recorded
	// container and a native turn of the recorded boundary or one more
	// (K13): it records that boundary and the conversation is usable again;
	// ErrInvalid otherwise, and the conversation stays quarantined.
	RecordContainer(ctx context.Context, ref wire.AttemptRef, req wire.ContainerRequest, now time.Time) error
	// Admit is idempotent for the same attempt and activation (same receipt).
	Admit(ctx context.Context, ref wire.AttemptRef, activationID string, now time.Time) (wire.AdmissionReceipt, error)
	// Settle records the boundary once; the same attempt and activation
	// again gets the same boundary without bumping the epoch, adding a
	// snapshot or changing the native turn (R27). ErrNotAdmitted before admission.
	Settle(ctx context.Context, ref wire.AttemptRef, req wire.SettlementRequest, now time.Time) (wire.Boundary, error)
	Notice(ctx context.Context, ref wire.AttemptRef, req wire.NoticeRequest, now time.Time) error
	// Abandon ends a never-admitted attempt as failed; the conversation
	// stays usable (R29). ErrAdmitted if the job was admitted (R30).
	Abandon(ctx context.Context, ref wire.AttemptRef, req wire.AbandonRequest, now time.Time) (wire.FinishResponse, error)
	// Release requeues a never-accepted turn in one statement that also
	// requires that no membership admitted the job (R36). ErrAdmitted otherwise.
	// Releases are counted per job (K7): the job waits out a release
	// backoff before it can be claimed again, and the release past the cap
	// (DefaultMaxReleases unless configured) fails it, its reason naming
	// the last release's class.
	Release(ctx context.Context, ref wire.AttemptRef, req wire.ReleaseRequest, now time.Time) error
	// Finish records the terminal report. The same report again gets the
	// first answer (P2). Admitted and unsettled with any outcome but
	// succeeded quarantines the conversation (K13); an unrecoverable
	// session marks it LOST (R31). An ambiguous admission is judged on the
	// attempt's admitted_at: none recorded, the turn ends as not started
	// and the conversation is untouched (R30); recorded, K13's quarantine.
	// worker_lost on a never-admitted job requeues it without counting an
	// attempt (P6).
	Finish(ctx context.Context, ref wire.AttemptRef, req wire.FinishRequest, now time.Time) (wire.FinishResponse, error)

	// Reap supersedes attempts whose lease expired before Now-Grace with an
	// attempt_superseded event: never admitted → requeued, counted as
	// worker lost (P6); admitted and not settled → conversation quarantined
	// (K13; R30, R35: never replayed), counted as worker lost, not as an
	// attempt (P6); settled → the
	// job succeeded with outcome report_missing and the conversation stays
	// usable at the recorded boundary (K2).
	Reap(ctx context.Context, p ReapParams) (ReapResult, error)
	// ReclaimDetail reclaims the bulky detail of jobs that ended before
	// p.Before (P8): the prompt, the worker token hashes of their attempts,
	// the runner's terminal report (its reason text) and the data of runner
	// events. The job's row, counts, states, outcome, plain-language reason
	// and timeline (every event's type and time) stay; GetJob shows
	// DetailReclaimedAt. It returns how many jobs it reclaimed; a job is
	// reclaimed once.
	ReclaimDetail(ctx context.Context, p ReclaimParams) (int, error)
	// ResumeAfterAbsence gives every running lease that had not expired
	// before the absence a full TTL from now when the control plane was
	// away longer than maxGap (P4), judged on the database's record of its
	// last sign of life. It records now and maxGap, and returns how many
	// leases it extended. Until a sweep resumes an absence, every guarded
	// write accepts a lease that expired inside it and Reap supersedes
	// none of those (K3).
	ResumeAfterAbsence(ctx context.Context, now time.Time, maxGap time.Duration) (int, error)

	// ClusterID is the cluster identity, created once with the database
	// and never changed (K8): the control plane returns it on host calls,
	// and a host removes sandboxes only on the word of the cluster it
	// pinned at first contact.
	ClusterID(ctx context.Context) (string, error)

	Close() error
}
