package integration

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// demoDirectives are every directive the demo agent knows, and the ones the
// product once obeyed or was once meant to (!decline-first,
// !preflight-fail): prompt content that must change nothing in the product.
var demoDirectives = []string{"!events 3", "!silent 10m", "!sleep 10m", "!exit 7", "!crash", "!hang", "!await never", "!decline-first", "!preflight-fail"}

// K12: a prompt made of every demo directive, run through the real daemon
// and turn child with the process backend and a plain agent (cat, which
// echoes its prompt and ends), is a turn like any other: accepted on its
// first attempt, never declined or released, succeeded, each line one
// agent.output event, the conversation usable — exactly what a prompt of
// plain words gets. Only the demo agent reads directives.
func TestPromptDirectivesChangeNothing(t *testing.T) {
	t.Parallel()
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Skip("no cat on this machine")
	}
	e := newEnv(t, envOpts{})
	d := e.startDaemon(nil)
	plain := []string{"hello", "how are you", "fine thanks", "and you", "good", "bye", "see you", "later", "then"}
	for _, tc := range []struct {
		name  string
		lines []string
	}{
		{"plain words", plain},
		{"every demo directive", demoDirectives},
	} {
		c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: tc.name, AgentCommand: []string{cat}})
		if err != nil {
			t.Fatal(err)
		}
		prompt := strings.Join(tc.lines, "\n") + "\n"
		j := e.waitEnded(e.send(c.ID, prompt).ID)
		if j.State != wire.JobSucceeded || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptFinished {
			t.Errorf("%s: want succeeded on its one attempt; got %s", tc.name, describeJob(j))
		}
		var echoed []string
		for _, ev := range j.Events {
			if ev.Type == "agent.output" {
				echoed = append(echoed, strings.Trim(string(ev.Data), `"`))
			}
		}
		if strings.Join(echoed, "\n") != strings.Join(tc.lines, "\n") {
			t.Errorf("%s: the agent's events %q, want its prompt's lines %q", tc.name, echoed, tc.lines)
		}
		if conv := e.conv(c.ID); conv.State != wire.ConversationUsable || conv.NativeTurn != 1 {
			t.Errorf("%s: conversation %s at native turn %d, want usable at 1", tc.name, conv.State, conv.NativeTurn)
		}
	}
	out := d.Output()
	for _, msg := range []string{`"msg":"agent_turn_declined"`, `"msg":"runnerd_turn_released"`, `"msg":"runnerd_launch_failed"`} {
		if strings.Contains(out, msg) {
			t.Errorf("the daemon's output has %s:\n%s", msg, out)
		}
	}
}
