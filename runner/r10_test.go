package runner

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/wire"
)

// R10: the claim counts as the first acknowledged renewal from when its
// request was SENT, not from when its answer arrived. The whole daemon
// runs (Run: claim loop, attempt, renewer, Reporter) at the default
// timings on fake time, against the real control plane behind a proxy
// that holds the claim's answer for 20 s after the control plane granted
// it. The child cannot be started (no executable), so the daemon owes a
// release; the proxy lets no renewal and no release through. The lease is
// given up locally exactly one lease (120 s) after the claim was sent —
// counted from the answer it would be 140 s, later than the server's own
// expiry — and from then on nothing more is sent about the attempt.
func TestR10ClaimCountedFromItsSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newK1World(t)
		conv, err := w.st.CreateConversation(context.Background(), wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.st.EnqueueTurn(context.Background(), conv.ID, "hello", time.Now()); err != nil {
			t.Fatal(err)
		}
		const held = 20 * time.Second
		w.proxy.set("claim", []answer{{delay: held}}, nil)
		w.proxy.set(wire.OpRenew, nil, &answer{hang: true})
		w.proxy.set(wire.OpRelease, nil, &answer{hang: true})
		d, logs := w.daemonWith(func(cfg *Config) { cfg.Executable = "/nonexistent/runnerd" })

		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		start := time.Now()
		go func() { ran <- d.Run(ctx) }()
		for !logs.has("agent_lease_expired") {
			time.Sleep(time.Second)
			if time.Since(start) > 10*time.Minute {
				t.Fatalf("no local lease expiry after 10 minutes: %s", logs)
			}
		}
		sent := w.proxy.triesOf("claim", start)
		if len(sent) == 0 {
			t.Fatal("no claim reached the proxy")
		}
		expired := recordTime(t, logs, "agent_lease_expired").Sub(start)
		if want := sent[0] + heartbeat.DefaultLeaseTTL; expired != want {
			t.Errorf("lease given up %v after the start, want %v: one lease after the claim's send (%v), not after its answer (%v)",
				expired, want, sent[0], sent[0]+held)
		}
		releases := w.proxy.triesOf(wire.OpRelease, start)
		if len(releases) == 0 {
			t.Fatal("the daemon never tried to release the claim it could not start")
		}
		time.Sleep(5 * time.Minute)
		if after := w.proxy.triesOf(wire.OpRelease, start); len(after) != len(releases) {
			t.Errorf("release tries went on after the local expiry: %v then %v", releases, after)
		}
		if last := releases[len(releases)-1]; last >= expired {
			t.Errorf("a release try at %v, after the lease was given up at %v", last, expired)
		}
		cancel()
		<-ran
	})
}

// recordTime is the time of the first record named msg.
func recordTime(t *testing.T, logs *logBuf, msg string) time.Time {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		var r struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Msg == msg {
			return r.Time
		}
	}
	t.Fatalf("no %s record", msg)
	return time.Time{}
}
