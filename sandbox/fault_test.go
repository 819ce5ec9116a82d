package sandbox_test

import (
	"testing"

	"github.com/runnerd/runnerd/sandbox"
)

// S4: every preflight class is either the conversation's fault (its image,
// its agent command, its spec) or the host's; a class this build does not
// know is the host's, so that a broken host can never hide behind it.
func TestS4ConversationFaultClasses(t *testing.T) {
	for class, conversation := range map[string]bool{
		sandbox.ClassImageUnavailable:  true,
		sandbox.ClassAgentMissing:      true,
		sandbox.ClassInvalidSpec:       true,
		sandbox.ClassLimitsUnsupported: true, // Limits: a limit this backend cannot apply
		sandbox.ClassEngineUnreachable: false,
		sandbox.ClassNetworkMissing:    false,
		sandbox.ClassSandboxBroken:     false,
		sandbox.ClassSupervisorMissing: false,
		sandbox.ClassStateDir:          false,
		"preflight_failed":             false,
		"a_class_of_a_newer_build":     false,
	} {
		if got := sandbox.ConversationFault(class); got != conversation {
			t.Errorf("ConversationFault(%q) = %v, want %v", class, got, conversation)
		}
	}
}
