package wire

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Labels are a host's routing labels, and a conversation's requirements:
// key=value pairs. A host meets a requirement set when it
// has every pair of it. Keys and values are short words of letters,
// digits, '.', '_' and '-' (keys lower case), so that a canonical set
// ("a=1,b=2", sorted by key) is unambiguous.
type Labels map[string]string

// Bounds of a label set.
const (
	MaxLabels     = 16
	MaxLabelBytes = 63
)

// Automatic host labels: every daemon sets them, none may be given by hand.
const (
	LabelSandbox = "sandbox" // the backend: SandboxDocker or SandboxProcess
	LabelOS      = "os"      // runtime.GOOS
	LabelArch    = "arch"    // runtime.GOARCH
)

// Sandbox backends a conversation may require (CreateConversationRequest.Sandbox).
const (
	SandboxDocker  = "docker"
	SandboxProcess = "process"
)

// Check refuses a label set that no store could route by: too many, or a
// key or value that is empty, too long or holds another character.
func (l Labels) Check() error {
	if len(l) > MaxLabels {
		return fmt.Errorf("at most %d labels", MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(l)) {
		if !labelWord(k, false) {
			return fmt.Errorf("label key %q must be 1 to %d of a-z 0-9 . _ -, starting with a letter or digit", k, MaxLabelBytes)
		}
		if !labelWord(l[k], true) {
			return fmt.Errorf("label %s: the value must be 1 to %d of A-Z a-z 0-9 . _ -", k, MaxLabelBytes)
		}
	}
	return nil
}

func labelWord(s string, upper bool) bool {
	if s == "" || len(s) > MaxLabelBytes {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case upper && r >= 'A' && r <= 'Z':
		case i > 0 && (r == '.' || r == '_' || r == '-'):
		default:
			return false
		}
	}
	return true
}

// String is the canonical form, "a=1,b=2" sorted by key; "" for none.
func (l Labels) String() string {
	pairs := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		pairs = append(pairs, k+"="+l[k])
	}
	return strings.Join(pairs, ",")
}

// ParseLabels reads the canonical form String writes.
func ParseLabels(s string) (Labels, error) {
	l := Labels{}
	if s == "" {
		return l, nil
	}
	for _, p := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", p)
		}
		l[k] = v
	}
	return l, l.Check()
}

// Missing lists the pairs of want that l lacks, in canonical order.
func (l Labels) Missing(want Labels) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := l[k]; !ok || v != want[k] {
			out = append(out, k+"="+want[k])
		}
	}
	return out
}
