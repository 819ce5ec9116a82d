package integration

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// hangingEngine is a Docker engine that answers pings and network
// inspections — the daemon's start-up probe goes through to the real engine,
// and so does the preflight's first step — and nothing else: every other
// request (the preflight's image inspection first) hangs, as an engine stuck
// behind a wedged storage driver does.
func hangingEngine(t *testing.T) string {
	t.Helper()
	real := "/var/run/docker.sock"
	if h, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok {
		real = h
	}
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", real)
	}}
	up := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: "docker"})
	up.Transport = tr
	closed := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/_ping") || strings.Contains(r.URL.Path, "/networks/") {
			up.ServeHTTP(w, r)
			return
		}
		select {
		case <-r.Context().Done():
		case <-closed:
		}
	})}
	go srv.Serve(l)
	t.Cleanup(func() {
		close(closed)
		srv.Close()
		tr.CloseIdleConnections()
	})
	return sock
}

// K6: the execution timeout ends the turn failed with class
// execution_timeout in whatever phase it strikes — a preflight that hangs
// (a Docker engine that answers pings and nothing else), a preparation whose
// container record, an admission and a settlement the control plane never
// answers, an agent that never ends — and never as a decline
// or a release: one attempt, ended by the runner's own report, no
// runnerd_turn_released record. The child's agent_execution_timeout record
// names the phase (its last progress stage). The deadline is the one the
// daemon put in the payload at launch, so the turn ends no earlier than
// the execution timeout after its claim.
func TestExecutionTimeoutInEveryPhase(t *testing.T) {
	t.Parallel()
	const limit = 2 * time.Second
	tests := []struct {
		name   string
		stage  string // the child's last progress stage when it struck
		docker bool
		prompt string
		setup  func(e *env, conv wire.Conversation)
	}{
		{name: "preflight", stage: "accepted", docker: true, prompt: "hello"},
		// The container record is the last step of preparation, before
		// admission: the control plane never answers it.
		{name: "preparation", stage: "accepted", prompt: "hello", setup: func(e *env, _ wire.Conversation) { e.faults.hang(wire.OpContainer) }},
		{name: "admission", stage: "admission_failed", prompt: "hello", setup: func(e *env, _ wire.Conversation) { e.faults.hang(wire.OpAdmission) }},
		{name: "stream loop", stage: "prompt_sent", prompt: "never ends\n!hang"},
		{name: "settlement", stage: "agent_exited", prompt: "quick\n!events 1", setup: func(e *env, _ wire.Conversation) { e.faults.hang(wire.OpSettlement) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{faults: true})
			d := e.startDaemon(func(c *fleet.DaemonConfig) {
				c.ExecTimeout = limit
				// Each receipt try outlasts the deadline: it strikes inside one.
				c.ReceiptTimeout = 3 * limit
				if tt.docker {
					c.Sandbox = "docker"
					c.Env = append(c.Env, "DOCKER_HOST=unix://"+hangingEngine(t))
					c.Args = append(c.Args, "--sandbox-sweep", "0")
				}
			})
			c, err := e.user.Create(e.ctx, wire.CreateConversationRequest{Title: tt.name, Image: "runnerd-never-pulled:latest", AgentCommand: []string{bins.DemoAgent}})
			if err != nil {
				t.Fatal(err)
			}
			if tt.setup != nil {
				tt.setup(e, c)
			}
			j := e.waitEnded(e.send(c.ID, tt.prompt).ID)
			if j.State != wire.JobFailed || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptFinished {
				t.Fatalf("want failed on its one attempt, reported by the runner; got %s", describeJob(j))
			}
			a := j.Attempts[0]
			fin, _ := findEvent(j, a.ID, "finished")
			if !strings.Contains(string(fin.Data), "execution_timeout") {
				t.Errorf("the terminal report does not name the execution timeout: %s", fin.Data)
			}
			if took := fin.Time.Sub(a.ClaimedAt); took < limit {
				t.Errorf("the turn was ended %v after its claim, before the %v execution timeout", took, limit)
			}
			out := d.Output()
			if strings.Contains(out, `"msg":"runnerd_turn_released"`) || strings.Contains(out, `"msg":"agent_turn_declined"`) {
				t.Errorf("a forced stop became a decline or a release:\n%s", out)
			}
			re := regexp.MustCompile(`"msg":"agent_execution_timeout","job_id":"` + j.ID + `","attempt_id":"[^"]+","stage":"` + tt.stage + `"`)
			if !re.MatchString(out) {
				t.Errorf("no agent_execution_timeout record at stage %q:\n%s", tt.stage, out)
			}
		})
	}
}
