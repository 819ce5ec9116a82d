package wire

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Limits are a conversation's resource limits (CreateConversationRequest,
// Conversation, Turn), fixed when it is created. A zero field is no limit
// of the conversation's own: the host's flag (--docker-cpus,
// --docker-memory, --docker-pids) applies. A host whose flag is lower
// applies its own: a sandbox never gets more than its host allows
// (docs/operations.md, "Limits").
type Limits struct {
	CPUs        float64 `json:"cpus,omitempty"`         // CPUs (fractions allowed)
	MemoryBytes int64   `json:"memory_bytes,omitempty"` // memory, no swap beyond it
	Pids        int64   `json:"pids,omitempty"`         // processes
	// DiskBytes is refused (CodeUnsupported): no sandbox backend can bound
	// a workspace's disk (CheckLimits says why).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// Bounds of a conversation's limits: below the minimum no agent starts
// (the engine refuses a container under 6 MiB), above the maximum the
// figure is a typo, not a limit.
const (
	MinLimitMemoryBytes = 6 << 20
	MaxLimitMemoryBytes = 1 << 40 // 1 TiB
	MaxLimitCPUs        = 1024
	MaxLimitPids        = 1 << 22 // the kernel's pid_max ceiling
)

// CodeUnsupported is the 400 answer to a limit no sandbox backend can apply.
const CodeUnsupported = "unsupported"

// ErrLimitUnsupported is CheckLimits' refusal of a limit no backend applies.
var ErrLimitUnsupported = errors.New("unsupported")

// ErrUnknownLimit is ParseLimits' refusal of a key it does not know.
var ErrUnknownLimit = errors.New("unknown limit")

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// CheckLimits says which field of l is wrong, or nil. sandbox is the
// backend the conversation requires (CreateConversationRequest.Sandbox):
// the process backend applies no limit, so a process conversation with
// limits is refused with ErrLimitUnsupported, as disk_bytes is on any.
func CheckLimits(l Limits, sandbox string) error {
	switch {
	case math.IsNaN(l.CPUs) || l.CPUs < 0 || l.CPUs > MaxLimitCPUs:
		return fmt.Errorf("limits.cpus must be between 0 and %d", MaxLimitCPUs)
	case l.CPUs != 0 && l.CPUs < 0.01:
		return errors.New("limits.cpus must be at least 0.01")
	case l.MemoryBytes < 0 || l.MemoryBytes > MaxLimitMemoryBytes:
		return fmt.Errorf("limits.memory_bytes must be between 0 and %d", int64(MaxLimitMemoryBytes))
	case l.MemoryBytes != 0 && l.MemoryBytes < MinLimitMemoryBytes:
		return fmt.Errorf("limits.memory_bytes must be at least %d (6 MiB)", MinLimitMemoryBytes)
	case l.Pids < 0 || l.Pids > MaxLimitPids:
		return fmt.Errorf("limits.pids must be between 0 and %d", MaxLimitPids)
	case l.DiskBytes < 0:
		return errors.New("limits.disk_bytes must not be negative")
	case l.DiskBytes != 0:
		return fmt.Errorf("limits.disk_bytes is %w: the workspace is a Docker local volume (or a host directory for the process backend), which has no quota; "+
			"the engine's storage quota bounds only the container's root filesystem, which is read-only", ErrLimitUnsupported)
	case sandbox == SandboxProcess && !l.IsZero():
		return fmt.Errorf("limits are %w for sandbox %q: the process backend's supervisor runs in no cgroup of the conversation's own", ErrLimitUnsupported, SandboxProcess)
	}
	return nil
}

// ParseLimits reads "cpus=2,memory_bytes=536870912,pids=64" (the
// `controlplane submit --limit` flag); "" is no limit. It checks the
// syntax only: CheckLimits checks the values.
func ParseLimits(s string) (Limits, error) {
	var l Limits
	if s == "" {
		return l, nil
	}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return l, fmt.Errorf("limit %q: want key=value", kv)
		}
		var err error
		switch k {
		case "cpus":
			l.CPUs, err = strconv.ParseFloat(v, 64)
		case "memory_bytes":
			l.MemoryBytes, err = strconv.ParseInt(v, 10, 64)
		case "pids":
			l.Pids, err = strconv.ParseInt(v, 10, 64)
		case "disk_bytes":
			l.DiskBytes, err = strconv.ParseInt(v, 10, 64)
		default:
			return l, fmt.Errorf("%w %q: want cpus, memory_bytes, pids or disk_bytes", ErrUnknownLimit, k)
		}
		if err != nil {
			return l, fmt.Errorf("limit %s: %q is not a number", k, v)
		}
	}
	return l, nil
}
