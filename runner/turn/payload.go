// Package turn is the turn child: what `runnerd turn` runs between the
// handover descriptor and the sandbox (architecture, "One turn", steps 3–8).
// The daemon (package runner) builds a Payload, hands it over on fd 3 and
// reads back PROGRESS frames carrying the turn's Facts and one RESULT frame
// carrying the terminal report, which the daemon persists and sends.
//
// Only runner, cmd/runnerd and cmd/internal/child import turn.
package turn

import (
	"time"

	"github.com/runnerd/runnerd/internal/tlsfiles"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// Payload is the Data of the handover PAYLOAD frame (JSON). It carries the
// attempt's worker token: it travels only over the descriptor.
type Payload struct {
	Claim           wire.Claim `json:"claim"`
	ControlPlaneURL string     `json:"control_plane_url"`
	// TLS names the daemon's TLS files for the control plane (its CA, its
	// client certificate): the child's calls trust what the daemon's do.
	TLS     tlsfiles.Client `json:"tls,omitzero"`
	Sandbox Sandbox         `json:"sandbox"`
	// The execution deadline (R5) and the lease travel in the handover
	// payload itself, as CLOCK_BOOTTIME instants (K5, K6).
	// RequestTimeoutMS bounds each receipt try (R24); 0 means 10 s.
	RequestTimeoutMS int64 `json:"request_timeout_ms,omitempty"`
	// RetryDelayMS is the pause between receipt tries (R24); 0 means 5 s.
	RetryDelayMS int64 `json:"retry_delay_ms,omitempty"`
	// PermissionTimeoutMS bounds how long an ACP permission request under
	// the ask policy waits for the owner; 0 means 10 min.
	PermissionTimeoutMS int64 `json:"permission_timeout_ms,omitempty"`
	// LogFormat is "json" or "text", for the child's own records on stderr.
	LogFormat string `json:"log_format,omitempty"`
}

// Sandbox says which backend the child uses and how to build it.
type Sandbox struct {
	Backend  string `json:"backend"`   // sandbox.BackendProcess | sandbox.BackendDocker
	StateDir string `json:"state_dir"` // the daemon's state directory
	HostName string `json:"host_name"`
	// Runnerd is the path of the runnerd executable: the process backend
	// starts `runnerd supervise` from it, the docker backend bind-mounts it.
	Runnerd string        `json:"runnerd"`
	Docker  DockerOptions `json:"docker,omitempty"`
	// TeardownBudget is the backend's proof budget for Stop and Remove
	// (S6, runnerd run --teardown-budget); zero: the default. Only the
	// daemon's own backend stops and removes, so it is not sent.
	TeardownBudget time.Duration `json:"-"`
}

// DockerOptions are the docker backend's safe defaults, each a daemon flag.
type DockerOptions struct {
	Pull        string `json:"pull,omitempty"` // docker.PullNever, PullMissing, PullAlways; "": missing
	Network     string `json:"network,omitempty"`
	PidsLimit   int64  `json:"pids_limit,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	NanoCPUs    int64  `json:"nano_cpus,omitempty"`
	LogMaxBytes int64  `json:"log_max_bytes,omitempty"`
	LogMaxFiles int    `json:"log_max_files,omitempty"`
}

// Stage is how far a turn has come, as each PROGRESS says (and the
// execution timeout's record names).
type Stage string

// The stages of a turn, in the order they can come.
const (
	StageAccepted           Stage = "accepted"
	StageContainerRecorded  Stage = "container_recorded"
	StageAdmissionFailed    Stage = "admission_failed"
	StageAdmitted           Stage = "admitted"
	StagePromptFailed       Stage = "prompt_failed"
	StagePromptSent         Stage = "prompt_sent"
	StageSettledInterrupted Stage = "settled_interrupted"
	StageAgentExited        Stage = "agent_exited"
	StageSettled            Stage = "settled"
)

// Progress is the body of a PROGRESS frame: what the turn has established so
// far, so that a daemon whose child died can still choose the right report
// (abandon when a container was recorded and nothing was admitted).
type Progress struct {
	Stage Stage            `json:"stage"`
	Facts settlement.Facts `json:"facts"`
	At    time.Time        `json:"at"`
}

// Result is the body of the RESULT frame: the terminal report, decided by
// the child from its Facts (settlement.Facts.Report), which the daemon
// persists and then sends (P2).
type Result struct {
	Report settlement.Report `json:"report"`
	// Outcome and Class repeat the report's, for the daemon's records and
	// metrics.
	Outcome string `json:"outcome"`
	Class   string `json:"class,omitempty"`
	// LeaseRejected: the lease is gone as far as the child knows — one of its
	// own writes was refused for it (409, 410, 401, 403, 404), or its own
	// lease deadline passed (K5) — possibly before the daemon's renewer
	// knows. The child stopped its agent at once; the daemon sends no report
	// and stops renewal: nothing more is written about the attempt (R8, R10,
	// R11, R22, R23).
	LeaseRejected bool `json:"lease_rejected,omitempty"`
	// ImagePull is the image pull the turn's sandbox needed, for the
	// daemon's metrics; nil when it needed none.
	ImagePull *ImagePull `json:"image_pull,omitempty"`
}

// ImagePull is one image pull of a turn: made in DurationMS, or failed
// (the turn then failed with ClassImageUnavailable).
type ImagePull struct {
	DurationMS int64 `json:"duration_ms"`
	Failed     bool  `json:"failed,omitempty"`
}
