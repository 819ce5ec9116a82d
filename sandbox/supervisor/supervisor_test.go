package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/internal/testbin"
	"github.com/runnerd/runnerd/wire"
)

func TestTurnStreamsEventsAndSettles(t *testing.T) {
	s := startServe(t)
	act, evs, res := runTurn(t, s.c, "hello\n!events 5")
	// turn.started, 5 deltas, the echo, turn.completed
	if len(evs) != 8 {
		t.Fatalf("got %d events, want 8: %+v", len(evs), evs)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Errorf("event %d has seq %d", i, ev.Seq)
		}
	}
	if evs[0].Type != "turn.started" || evs[1].Type != "message.delta" || evs[7].Type != "turn.completed" {
		t.Errorf("event types: %s %s … %s", evs[0].Type, evs[1].Type, evs[7].Type)
	}
	if res.ExitCode != 0 || res.NativeTurn != 1 {
		t.Fatalf("result %+v, want exit 0 at native turn 1", res)
	}
	rc, err := s.c.Settle(context.Background(), act.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rc.ActivationID != act.ID || rc.NativeTurn != 1 || rc.ExitCode != 0 || rc.ReceiptID == "" {
		t.Fatalf("receipt %+v", rc)
	}
}

// Every older token is refused once a newer activation exists.
func TestActivationFencesOlderToken(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	a1, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if a1.ID == a2.ID {
		t.Fatal("two activations got the same token")
	}
	if _, err := s.c.Run(ctx, a1.ID, []string{demoAgent}, "from the fenced owner"); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("run with the older token: %v, want ErrFenced", err)
	}
	if _, err := s.c.Settle(ctx, a1.ID); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("settle with the older token: %v, want ErrFenced", err)
	}
	if got := transcript(t, s.ws); len(got) != 0 {
		t.Fatalf("the fenced run reached the agent: %q", got)
	}
	turn, err := s.c.Run(ctx, a2.ID, []string{demoAgent}, "from the owner")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	drain(t, turn)
	if got := transcript(t, s.ws); !slices.Equal(got, []string{"from the owner"}) {
		t.Fatalf("transcript %q", got)
	}
}

// A newer activation stops the turn an older token still runs, before it
// answers, and the older driver learns it was fenced.
func TestNewerActivationStopsRunningTurn(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	a1, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := s.c.Run(ctx, a1.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	if !testbin.Alive(pid) {
		t.Fatal("agent not running")
	}
	a2, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if testbin.Alive(pid) {
		t.Fatal("the fenced turn's agent is still alive after the newer activation returned")
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("fenced stream ended with %v, want ErrFenced", err)
	}
	if _, err := s.c.Settle(ctx, a1.ID); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("settle fenced: %v", err)
	}
	if _, err := s.c.Settle(ctx, a2.ID); !errors.Is(err, sandbox.ErrNotRun) {
		t.Fatalf("settle of an activation that ran nothing: %v, want ErrNotRun", err)
	}
}

// R26: the receipt of the last token's settlement is kept until another
// activation takes ownership.
func TestReceiptRetainedUntilNextActivation(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, _, _ := runTurn(t, s.c, "!events 2")
	r1, err := s.c.Settle(ctx, act.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Again, from a fresh client (a retried settlement after a lost answer).
	r2, err := (&sandbox.Client{Socket: s.sock}).Settle(ctx, act.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r1 != r2 {
		t.Fatalf("second settlement returned %+v, first %+v", r2, r1)
	}
	if _, err := s.c.Activate(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrFenced) {
		t.Fatalf("settle after another activation: %v, want ErrFenced", err)
	}
}

// R25 (supervisor part): one activation hands one prompt to the agent, at
// most once; a repeated run is refused without reaching the agent.
func TestRunRefusedTwicePerActivation(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, _, _ := runTurn(t, s.c, "only once")
	if _, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "only once"); !errors.Is(err, sandbox.ErrAlreadyRun) {
		t.Fatalf("second run: %v, want ErrAlreadyRun", err)
	}
	if got := transcript(t, s.ws); !slices.Equal(got, []string{"only once"}) {
		t.Fatalf("the agent received %q", got)
	}
}

func TestStartFailureSpendsActivationWithoutPrompt(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-such-agent")
	if _, err := s.c.Run(ctx, act.ID, []string{missing}, "p"); !errors.Is(err, sandbox.ErrStartFailed) {
		t.Fatalf("run of a missing agent: %v, want ErrStartFailed", err)
	}
	if _, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "p"); !errors.Is(err, sandbox.ErrAlreadyRun) {
		t.Fatalf("run after a failed start: %v, want ErrAlreadyRun", err)
	}
	if _, err := s.c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrNotRun) {
		t.Fatalf("settle after a failed start: %v, want ErrNotRun", err)
	}
	if got := transcript(t, s.ws); len(got) != 0 {
		t.Fatalf("a prompt reached the agent: %q", got)
	}
}

// The driving connection dropping stops the agent (its process group is
// killed), and the turn has no receipt.
func TestDrivingConnectionDropStopsAgent(t *testing.T) {
	for _, prompt := range []string{"!hang", "!silent 400s", "!sleep 400s"} {
		t.Run(strings.Fields(prompt)[0], func(t *testing.T) {
			s := startServe(t)
			ctx := context.Background()
			act, err := s.c.Activate(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, prompt)
			if err != nil {
				t.Fatal(err)
			}
			pid := eventField[int](t, nextEvent(t, turn), "pid")
			if st, err := s.c.Status(ctx); err != nil || !st.Busy {
				t.Fatalf("status while the agent runs: %+v, %v", st, err)
			}
			turn.Close()
			s.rec.waitFor(t, "supervisor_turn_stopped", 1)
			if err := testbin.WaitGone(pid, waitLimit); err != nil {
				t.Fatal(err)
			}
			if _, err := s.c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrInterrupted) {
				t.Fatalf("settle of a dropped turn: %v, want ErrInterrupted", err)
			}
			if st, err := s.c.Status(ctx); err != nil || st.Busy {
				t.Fatalf("status after the stop: %+v, %v", st, err)
			}
		})
	}
}

// Cancelling the context of Run is a drop too.
func TestRunContextCancelStopsAgent(t *testing.T) {
	s := startServe(t)
	ctx, cancel := context.WithCancel(context.Background())
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	cancel()
	s.rec.waitFor(t, "supervisor_turn_stopped", 1)
	if err := testbin.WaitGone(pid, waitLimit); err != nil {
		t.Fatal(err)
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("stream ended with %v, want ErrInterrupted", err)
	}
}

// R31 (busy): busy covers the agent-turn transport only — while a turn's
// agent runs — and says nothing about other work in the workspace.
func TestStatusBusyReportsOnlyTheAgentTurn(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	st, err := s.c.Status(ctx)
	if err != nil || st.Busy || st.ID != "test-sandbox" {
		t.Fatalf("idle status %+v, %v", st, err)
	}
	// A workspace-setup command run beside the supervisor, not through it:
	// it writes into the workspace while busy stays false.
	setup := exec.Command("sh", "-c", "echo setup > setup.txt; cat >/dev/null")
	setup.Dir = s.ws
	stdin, err := setup.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Start(); err != nil {
		t.Fatal(err)
	}
	if st, err := s.c.Status(ctx); err != nil || st.Busy {
		t.Fatalf("status beside a setup command: %+v, %v — busy must not cover it", st, err)
	}
	stdin.Close()
	if err := setup.Wait(); err != nil {
		t.Fatal(err)
	}

	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.c.Status(ctx); st.Busy {
		t.Fatal("busy after activate, before run")
	}
	turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	nextEvent(t, turn)
	if st, _ := s.c.Status(ctx); !st.Busy {
		t.Fatal("not busy while the agent runs")
	}
	if _, err := s.c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("settle during the turn: %v, want ErrBusy", err)
	}
	// A newer activation returns once the older agent is dead.
	act2, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.c.Status(ctx); st.Busy {
		t.Fatal("busy after the running turn was fenced")
	}
	turn2, err := s.c.Run(ctx, act2.ID, []string{demoAgent}, "!events 1")
	if err != nil {
		t.Fatal(err)
	}
	defer turn2.Close()
	drain(t, turn2)
	if st, _ := s.c.Status(ctx); st.Busy {
		t.Fatal("busy after the turn ended")
	}
}

// R28: a restarted supervisor knows no earlier token; settlement of a turn
// that completed before the restart fails closed.
func TestRestartForgetsReceiptsAndFailsClosed(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock)
	act, _, res := runTurn(t, c, "!events 1")
	if _, err := c.Settle(ctx, act.ID); err != nil {
		t.Fatal(err)
	}
	p.kill()
	if _, err := c.Status(ctx); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("status of a dead supervisor: %v, want ErrUnavailable", err)
	}
	startProc(t, ws, sock)
	if _, err := c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle after restart: %v, want ErrUnknownActivation", err)
	}
	if _, err := c.Run(ctx, act.ID, []string{demoAgent}, "replay"); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("run with a pre-restart token: %v, want ErrUnknownActivation", err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.NativeTurn != res.NativeTurn {
		t.Fatalf("native turn after restart %d, want %d", st.NativeTurn, res.NativeTurn)
	}
	if got := transcript(t, ws); len(got) != 1 {
		t.Fatalf("transcript %q", got)
	}
}

// R28: the supervisor dying mid-turn interrupts the turn and kills its
// agent; the restarted supervisor has no receipt for it.
func TestSupervisorDeathMidTurnFailsClosed(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock)
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	turn, err := c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	p.kill()
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("stream ended with %v, want ErrInterrupted", err)
	}
	if err := testbin.WaitGone(pid, waitLimit); err != nil {
		t.Fatalf("agent outlived its supervisor: %v", err)
	}
	startProc(t, ws, sock)
	if _, err := c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle after restart: %v, want ErrUnknownActivation", err)
	}
}

// A resumed conversation continues its native turn ordinal across turns and
// across a supervisor restart; no prompt reaches the agent twice.
func TestResumedConversationContinuesNativeTurn(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock)
	for want := int64(1); want <= 2; want++ {
		act, evs, res := runTurn(t, c, "turn "+string(rune('0'+want)))
		if res.NativeTurn != want || eventField[int64](t, evs[0], "native_turn") != want {
			t.Fatalf("turn %d: result %+v, first event %s", want, res, evs[0].Data)
		}
		rc, err := c.Settle(ctx, act.ID)
		if err != nil || rc.NativeTurn != want {
			t.Fatalf("receipt %+v, %v", rc, err)
		}
	}
	p.kill()
	startProc(t, ws, sock)
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if act.NativeTurn != 2 {
		t.Fatalf("activation after restart starts at native turn %d, want 2", act.NativeTurn)
	}
	turn, err := c.Run(ctx, act.ID, []string{demoAgent}, "turn 3")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	_, res := drain(t, turn)
	rc, err := c.Settle(ctx, act.ID)
	if err != nil || res.NativeTurn != 3 || rc.NativeTurn != 3 {
		t.Fatalf("third turn: result %+v receipt %+v %v", res, rc, err)
	}
	if got := transcript(t, ws); !slices.Equal(got, []string{"turn 1", "turn 2", "turn 3"}) {
		t.Fatalf("transcript %q", got)
	}
}

func TestAgentExitCodeAndCrash(t *testing.T) {
	for _, tc := range []struct {
		name, prompt string
		code         int
		signal       string
	}{
		{name: "exit", prompt: "!exit 3", code: 3},
		{name: "crash", prompt: "!crash", code: -1, signal: "SIGKILL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServe(t)
			act, _, res := runTurn(t, s.c, tc.prompt)
			if res.ExitCode != tc.code || res.Signal != tc.signal {
				t.Fatalf("result %+v, want exit %d signal %q", res, tc.code, tc.signal)
			}
			rc, err := s.c.Settle(context.Background(), act.ID)
			if err != nil || rc.ExitCode != tc.code {
				t.Fatalf("receipt %+v, %v", rc, err)
			}
		})
	}
}

// A socket path longer than a sockaddr holds still works.
func TestLongSocketPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "supervisor.sock")
	p := startProc(t, filepath.Join(dir, "ws"), sock)
	st, err := (&sandbox.Client{Socket: sock}).Status(context.Background())
	if err != nil || st.PID != p.cmd.Process.Pid {
		t.Fatalf("status over a %d-byte path: %+v, %v", len(sock), st, err)
	}
}

func TestProtocolRefusesMalformedRequests(t *testing.T) {
	s := startServe(t)
	for _, tc := range []struct{ name, line string }{
		{"not json", "hello\n"},
		{"unknown field", `{"v":1,"op":"status","extra":1}` + "\n"},
		{"unknown version", `{"v":4,"op":"status"}` + "\n"},
		{"no version", `{"op":"status"}` + "\n"},
		{"unknown op", `{"v":1,"op":"explode"}` + "\n"},
		{"trailing data", `{"v":1,"op":"status"} {}` + "\n"},
		{"empty command", `{"v":1,"op":"run","activation":"x"}` + "\n"},
		{"oversize", strings.Repeat("x", sandbox.MaxMessageBytes+10) + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("unix", s.sock)
			if err != nil {
				t.Fatal(err)
			}
			wrote := make(chan struct{})
			go func() {
				defer close(wrote)
				_, _ = conn.Write([]byte(tc.line)) // an oversize line is cut short by the close
			}()
			line, err := sandbox.ReadLine(bufio.NewReader(conn), sandbox.MaxMessageBytes)
			conn.Close()
			<-wrote
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(line), `"code":"protocol"`) {
				t.Fatalf("answer %s, want a protocol error", line)
			}
		})
	}
}

// With --subreaper (the default as a container's PID 1) what an agent
// leaves behind is reparented to the supervisor and reaped, and the agent's
// own exit status is not stolen by the reaper.
func TestSubreaperReapsWhatAgentsLeaveBehind(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}
	p := startProc(t, ws, sock, "--subreaper")
	for i := range 3 {
		act, err := c.Activate(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		script := `sleep 1000 & echo "{\"type\":\"bg\",\"pid\":$!}"; exit 4`
		turn, err := c.Run(ctx, act.ID, []string{"sh", "-c", script}, "")
		if err != nil {
			t.Fatal(err)
		}
		evs, res := drain(t, turn)
		turn.Close()
		if len(evs) != 1 || res.ExitCode != 4 {
			t.Fatalf("turn %d: events %+v result %+v", i, evs, res)
		}
		bg := eventField[int](t, evs[0], "pid")
		p.lines.waitFor(t, fmt.Sprintf(`"msg":"supervisor_orphan_reaped","pid":%d}`, bg))
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", bg)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("orphan %d still in the process table: %v", bg, err)
		}
	}
}

// A driver that stopped reading (a frozen turn child) does not hold up the
// newer activation that fences it: writes to it are cut off after the
// drain timeout, and the agent is dead when Activate returns.
func TestFencingDoesNotWaitForStalledDriver(t *testing.T) {
	s := startServe(t, func(c *Config) { c.DrainTimeout = 200 * time.Millisecond })
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// yes(1) writes far faster than anyone reads: the socket and pipe
	// buffers are full long before the test asks for the next activation.
	turn, err := s.c.Run(ctx, act.ID, []string{"yes", `{"type":"flood"}`}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	nextEvent(t, turn)
	actx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	if _, err := s.c.Activate(actx, 0); err != nil {
		t.Fatalf("activation behind a stalled driver: %v", err)
	}
	if st, err := s.c.Status(ctx); err != nil || st.Busy {
		t.Fatalf("status after fencing: %+v, %v", st, err)
	}
}

// The agent gets a minimal environment — nothing of the supervisor's, where
// a host secret might live — and no descriptor beyond stdin, stdout and
// stderr: not the supervisor's socket, not a driving connection, and not a
// descriptor the supervisor itself inherited without close-on-exec.
func TestAgentInheritsNoEnvironmentOrDescriptors(t *testing.T) {
	leak, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0) // no O_CLOEXEC: a starter's leak
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock")
	t.Setenv("RUNNERD_TEST_SECRET", "do-not-leak")
	startProc(t, ws, sock)
	c := &sandbox.Client{Socket: sock}
	ctx := context.Background()
	act, err := c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A shell, not a Go program: no runtime descriptors of its own.
	// (The glob's own directory descriptor is closed again by the time the
	// loop tests each entry.)
	script := `env; echo --; for f in /proc/$$/fd/*; do [ -e "$f" ] && echo "fd ${f##*/}"; done; true`
	turn, err := c.Run(ctx, act.ID, []string{"sh", "-c", script}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	evs, res := drain(t, turn)
	if res.ExitCode != 0 {
		t.Fatalf("introspection: %+v", res)
	}
	var lines []string
	for _, ev := range evs {
		var line string
		if err := json.Unmarshal(ev.Data, &line); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, line)
	}
	sep := slices.Index(lines, "--")
	if sep < 0 {
		t.Fatalf("output %q", lines)
	}
	env, fds := lines[:sep], strings.Join(lines[sep+1:], " ")
	slices.Sort(env)
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PWD=") }) // set by sh
	want := []string{"HOME=" + ws, "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"}
	if !slices.Equal(env, want) {
		t.Fatalf("agent environment %q, want %q", env, want)
	}
	if fds != "fd 0 fd 1 fd 2" {
		t.Fatalf("agent descriptors %q, want only 0, 1 and 2", fds)
	}
}

// K5: the supervisor stops an activation's agent by itself when its lease
// deadline passes on CLOCK_BOOTTIME, though the driving connection stays
// open (a frozen turn child); deadline moves it, the newest call winning;
// a run after the deadline is refused before any prompt reaches an agent.
func TestLeaseDeadlineStopsAgent(t *testing.T) {
	t.Run("driver open", func(t *testing.T) {
		s := startServe(t)
		ctx := context.Background()
		act, err := s.c.Activate(ctx, boottime.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
		if err != nil {
			t.Fatal(err)
		}
		defer turn.Close()
		pid := eventField[int](t, nextEvent(t, turn), "pid")
		deadline := boottime.Now().Add(400 * time.Millisecond)
		if err := s.c.SetDeadline(ctx, act.ID, deadline); err != nil {
			t.Fatal(err)
		}
		if err := testbin.WaitGone(pid, waitLimit); err != nil {
			t.Fatal(err)
		}
		gone := boottime.Now()
		if gone.Before(deadline) {
			t.Fatalf("agent stopped %v before its deadline", deadline.Sub(gone))
		}
		t.Logf("agent gone %v after the deadline", gone.Sub(deadline))
		if late := gone.Sub(deadline); late > time.Second {
			t.Fatalf("agent lived %v past its deadline", late)
		}
		if err := streamEnd(turn); !errors.Is(err, sandbox.ErrDeadlinePassed) {
			t.Fatalf("stream ended with %v, want ErrDeadlinePassed", err)
		}
		if _, err := s.c.Settle(ctx, act.ID); !errors.Is(err, sandbox.ErrInterrupted) {
			t.Fatalf("settle after the deadline: %v, want ErrInterrupted", err)
		}
		if err := s.c.SetDeadline(ctx, act.ID, boottime.Now().Add(time.Hour)); !errors.Is(err, sandbox.ErrDeadlinePassed) {
			t.Fatalf("deadline after the stop: %v, want ErrDeadlinePassed", err)
		}
		s.rec.waitFor(t, "supervisor_turn_stopped", 1)
	})
	t.Run("run after the deadline", func(t *testing.T) {
		s := startServe(t)
		ctx := context.Background()
		act, err := s.c.Activate(ctx, boottime.Now().Add(-time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!hang"); !errors.Is(err, sandbox.ErrDeadlinePassed) {
			t.Fatalf("run after the deadline: %v, want ErrDeadlinePassed", err)
		}
		if got := transcript(t, s.ws); len(got) != 0 {
			t.Fatalf("the agent saw prompts %q", got)
		}
	})
	t.Run("fenced token", func(t *testing.T) {
		s := startServe(t)
		ctx := context.Background()
		old, err := s.c.Activate(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.c.Activate(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.c.SetDeadline(ctx, old.ID, boottime.Now().Add(time.Hour)); !errors.Is(err, sandbox.ErrFenced) {
			t.Fatalf("deadline for a fenced token: %v, want ErrFenced", err)
		}
	})
}

// K10 (supervisor part): an interrupt on request stops the running agent,
// waits until nothing of the turn runs and settles an interrupted boundary:
// the receipt says interrupted, is retained for the token (R26), and the
// next activation resumes from it — the native turn ordinal continues, and
// every prompt reached the agent once.
func TestInterruptSettlesInterruptedBoundary(t *testing.T) {
	s := startServe(t)
	ctx := context.Background()
	runTurn(t, s.c, "first")
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if act.NativeTurn != 1 {
		t.Fatalf("activation after one turn starts from %d", act.NativeTurn)
	}
	if _, err := s.c.Interrupt(ctx, act.ID, 0); !errors.Is(err, sandbox.ErrNotRun) {
		t.Fatalf("interrupt before a run: %v, want ErrNotRun", err)
	}
	turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "second\n!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	r, err := s.c.Interrupt(ctx, act.ID, 5*time.Second)
	if err != nil {
		t.Fatalf("interrupt: %v", err)
	}
	if !r.Interrupted || r.ActivationID != act.ID || r.NativeTurn != 2 {
		t.Fatalf("interrupt receipt %+v, want interrupted at native turn 2 for %s", r, act.ID)
	}
	if err := testbin.WaitGone(pid, time.Second); err != nil {
		t.Fatalf("the agent outlived the interrupt's answer: %v", err)
	}
	if err := streamEnd(turn); !errors.Is(err, sandbox.ErrInterrupted) {
		t.Fatalf("the driving connection's stream ended with %v, want ErrInterrupted", err)
	}
	// Retained for the token, from any client, through settle and interrupt.
	for _, again := range []func() (wire.SupervisorReceipt, error){
		func() (wire.SupervisorReceipt, error) { return (&sandbox.Client{Socket: s.sock}).Settle(ctx, act.ID) },
		func() (wire.SupervisorReceipt, error) { return s.c.Interrupt(ctx, act.ID, 0) },
	} {
		if r2, err := again(); err != nil || r2 != r {
			t.Fatalf("receipt asked again: %+v, %v; first %+v", r2, err, r)
		}
	}
	if st, err := s.c.Status(ctx); err != nil || st.Busy || st.NativeTurn != 2 {
		t.Fatalf("status after the interrupt: %+v, %v", st, err)
	}
	_, _, res := runTurn(t, s.c, "third")
	if res.NativeTurn != 3 {
		t.Fatalf("the turn after the interrupted one ended at native turn %d, want 3", res.NativeTurn)
	}
	if got := transcript(t, s.ws); !slices.Equal(got, []string{"first", "second\n!hang", "third"}) {
		t.Fatalf("the agent received %q", got)
	}
}

// K10: an agent that does not stop on SIGINT is killed once the grace has
// passed, and the boundary still settles as interrupted; an interrupt of a
// turn that ended on its own answers its ordinary receipt; of a turn
// stopped another way, no receipt.
func TestInterruptGraceAndOtherEndings(t *testing.T) {
	ctx := context.Background()
	t.Run("ignores_sigint", func(t *testing.T) {
		s := startServe(t)
		act, err := s.c.Activate(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		agent := []string{"/bin/sh", "-c", `trap '' INT; echo '{"type":"turn.started"}'; exec sleep 400`}
		turn, err := s.c.Run(ctx, act.ID, agent, "")
		if err != nil {
			t.Fatal(err)
		}
		defer turn.Close()
		nextEvent(t, turn)
		const grace = 300 * time.Millisecond
		start := time.Now()
		r, err := s.c.Interrupt(ctx, act.ID, grace)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < grace {
			t.Fatalf("an agent ignoring SIGINT was killed after %v, before the grace of %v", took, grace)
		}
		if !r.Interrupted || r.ExitCode != -1 || r.NativeTurn != 1 {
			t.Fatalf("receipt %+v, want interrupted, killed, native turn 1", r)
		}
		s.rec.waitFor(t, RecordInterrupting, 1)
	})
	t.Run("ended_on_its_own", func(t *testing.T) {
		s := startServe(t)
		act, _, _ := runTurn(t, s.c, "done")
		r, err := s.c.Interrupt(ctx, act.ID, 0)
		if err != nil || r.Interrupted || r.NativeTurn != 1 {
			t.Fatalf("interrupt after the turn ended: %+v, %v; want its ordinary receipt", r, err)
		}
	})
	t.Run("dropped", func(t *testing.T) {
		s := startServe(t)
		act, err := s.c.Activate(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
		if err != nil {
			t.Fatal(err)
		}
		nextEvent(t, turn)
		turn.Close()
		s.rec.waitFor(t, RecordTurnStopped, 1)
		if _, err := s.c.Interrupt(ctx, act.ID, 0); !errors.Is(err, sandbox.ErrInterrupted) {
			t.Fatalf("interrupt of a dropped turn: %v, want ErrInterrupted", err)
		}
	})
}

// K13, R26: each activation's answer carries what the supervisor retains of
// the activation it fenced — the token, the boundary it left and how it
// ended — and the record of the last activation that ran a turn is in the
// supervisor's state, so it survives a restart (a replacement of an
// outdated supervisor is one) where the in-memory receipt does not (R28).
// A supervisor over another state directory, at the same boundary, retains
// no record: a boundary that looks right is not evidence.
func TestActivationCarriesTheRetainedRecord(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock, "--state", state)
	if st, err := c.Status(ctx); err != nil || st.Version != sandbox.ProtocolVersion {
		t.Fatalf("status %+v, %v: want version %d", st, err, sandbox.ProtocolVersion)
	}
	first, err := c.Activate(ctx, 0)
	if err != nil || first.Previous != nil {
		t.Fatalf("first activation %+v, %v: want no record", first, err)
	}
	ran, _, _ := runTurn(t, c, "!events 1")
	idle, err := c.Activate(ctx, 0)
	want := sandbox.Retained{Activation: ran.ID, NativeTurn: 1, Ended: sandbox.EndedCompleted}
	if err != nil || idle.Previous == nil || !reflect.DeepEqual(*idle.Previous, want) {
		t.Fatalf("after a completed turn: previous %+v, %v; want %+v", idle.Previous, err, want)
	}
	next, err := c.Activate(ctx, 0)
	if want := (sandbox.Retained{Activation: idle.ID, NativeTurn: 1, Ended: sandbox.EndedNotRun, LastRan: ran.ID}); err != nil || next.Previous == nil || !reflect.DeepEqual(*next.Previous, want) {
		t.Fatalf("after an activation that ran nothing: previous %+v, %v; want %+v", next.Previous, err, want)
	}
	// A turn cut off by its driving connection: no receipt, a record.
	turn, err := c.Run(ctx, next.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	nextEvent(t, turn)
	turn.Close()
	p.lines.waitFor(t, RecordTurnStopped) // recorded once the turn's end is
	p.kill()

	startProc(t, ws, sock, "--state", state)
	after, err := c.Activate(ctx, 0)
	if want := (sandbox.Retained{Activation: next.ID, NativeTurn: 2, Ended: "connection_dropped"}); err != nil || after.Previous == nil || !reflect.DeepEqual(*after.Previous, want) || after.NativeTurn != 2 {
		t.Fatalf("after a restart: %+v, %v; want previous %+v at native turn 2", after, err, want)
	}
	if _, err := c.Settle(ctx, next.ID); !errors.Is(err, sandbox.ErrUnknownActivation) {
		t.Fatalf("settle after restart: %v, want ErrUnknownActivation (R28)", err)
	}

	// Another state of a release that keeps records, at the same boundary:
	// no record of anything.
	other := filepath.Join(dir, "other-state")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{sandbox.NativeTurnFile: "2\n", sandbox.StateVersionFile: "2\n"} {
		if err := os.WriteFile(filepath.Join(other, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sock2 := filepath.Join(dir, "s2.sock")
	startProc(t, ws, sock2, "--state", other)
	fresh, err := (&sandbox.Client{Socket: sock2}).Activate(ctx, 0)
	if err != nil || fresh.NativeTurn != 2 || fresh.Previous != nil {
		t.Fatalf("over another state: %+v, %v; want native turn 2 and no record", fresh, err)
	}
}

// A supervisor killed while its turn runs leaves the record of that turn's
// activation, written before the prompt reached the agent: the restarted
// supervisor's next activation names it at the boundary the turn started
// from, not the turn before it (K13: the chaos campaign's avoidable LOST).
func TestSupervisorKilledMidTurnRetainsItsActivation(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock, "--state", state)
	runTurn(t, c, "!events 1")
	act, err := c.Activate(ctx, 0)
	if err != nil || act.NativeTurn != 1 {
		t.Fatalf("activation %+v, %v: want native turn 1", act, err)
	}
	turn, err := c.Run(ctx, act.ID, []string{demoAgent}, "!hang")
	if err != nil {
		t.Fatal(err)
	}
	defer turn.Close()
	pid := eventField[int](t, nextEvent(t, turn), "pid")
	p.kill()
	if err := testbin.WaitGone(pid, waitLimit); err != nil {
		t.Fatalf("agent outlived its supervisor: %v", err)
	}

	startProc(t, ws, sock, "--state", state)
	after, err := c.Activate(ctx, 0)
	want := sandbox.Retained{Activation: act.ID, NativeTurn: 1, Ended: sandbox.EndedUnfinished}
	if err != nil || after.Previous == nil || !reflect.DeepEqual(*after.Previous, want) || after.NativeTurn != 1 {
		t.Fatalf("after a kill mid-turn: %+v, %v; want previous %+v at native turn 1", after, err, want)
	}
}

// A supervisor killed between the two writes of an ended turn — its record
// (ended, at the new boundary) on disk, the native turn not yet — comes
// back at the record's boundary: the next activation presents the record
// and a boundary that agree, so a quarantined conversation whose
// interrupted turn had just ended resumes instead of being lost on a write
// that did not happen (K13: the chaos campaign's avoidable LOST with class
// retained_receipt_mismatch). The state is made as that kill leaves it:
// the native turn file put back to the boundary before the turn.
func TestKillBetweenRecordAndBoundaryCompletesTheBoundary(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock, "--state", state)
	runTurn(t, c, "!events 1")
	act, _, res := runTurn(t, c, "!events 1")
	if res.NativeTurn != 2 {
		t.Fatalf("second turn ended at native turn %d, want 2", res.NativeTurn)
	}
	p.kill()
	if err := os.WriteFile(filepath.Join(state, sandbox.NativeTurnFile), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	p = startProc(t, ws, sock, "--state", state)
	after, err := c.Activate(ctx, 0)
	want := sandbox.Retained{Activation: act.ID, NativeTurn: 2, Ended: sandbox.EndedCompleted}
	if err != nil || after.Previous == nil || !reflect.DeepEqual(*after.Previous, want) || after.NativeTurn != 2 {
		t.Fatalf("after a kill between the record and the boundary: %+v, %v; want previous %+v at native turn 2", after, err, want)
	}
	if raw, err := os.ReadFile(filepath.Join(state, sandbox.NativeTurnFile)); err != nil || string(raw) != "2\n" {
		t.Errorf("native turn file %q (%v), want 2", raw, err)
	}
	if !p.lines.contains(`"msg":"` + RecordBoundaryCompleted + `"`) {
		t.Errorf("no %s record", RecordBoundaryCompleted)
	}

	// A record that does not end a turn never moves the boundary: the
	// activation's own record (not run) is at the boundary it was given.
	p.kill()
	if err := os.WriteFile(filepath.Join(state, sandbox.NativeTurnFile), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, ws, sock, "--state", state)
	again, err := c.Activate(ctx, 0)
	if err != nil || again.NativeTurn != 1 || again.Previous == nil || again.Previous.Ended != sandbox.EndedNotRun {
		t.Fatalf("after a not-run record over boundary 1: %+v, %v; want native turn 1 and the not-run record", again, err)
	}
}

// K13: an activation that verified and then ran nothing, and one admitted
// whose supervisor died before its turn started, leave records on disk: the
// next activation after a restart still finds the interrupted activation,
// either named or as the last that ran before the ones that ran nothing.
func TestNotRunActivationsKeepTheInterruptedOne(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}

	p := startProc(t, ws, sock, "--state", state)
	ran, _, _ := runTurn(t, c, "!events 1")
	idle, err := c.Activate(ctx, 0) // verified, never admitted: runs nothing
	if err != nil {
		t.Fatal(err)
	}
	admitted, err := c.Activate(ctx, 0) // admitted; its supervisor dies before its turn
	if err != nil {
		t.Fatal(err)
	}
	if want := (sandbox.Retained{Activation: idle.ID, NativeTurn: 1, Ended: sandbox.EndedNotRun, LastRan: ran.ID}); admitted.Previous == nil || !reflect.DeepEqual(*admitted.Previous, want) {
		t.Fatalf("after an activation that ran nothing: previous %+v, want %+v", admitted.Previous, want)
	}
	p.kill()

	startProc(t, ws, sock, "--state", state)
	after, err := c.Activate(ctx, 0) // the next turn: verifies, then its child dies before admission
	want := sandbox.Retained{Activation: admitted.ID, NativeTurn: 1, Ended: sandbox.EndedNotRun, LastRan: ran.ID, Idle: []string{idle.ID}}
	if err != nil || after.Previous == nil || !reflect.DeepEqual(*after.Previous, want) || after.NativeTurn != 1 {
		t.Fatalf("after a restart: %+v, %v; want previous %+v at native turn 1", after, err, want)
	}
	// Its next attempt still finds the admitted activation, which ran
	// nothing, among those that ran nothing since the last that ran (the
	// chaos campaign's avoidable LOST with retained_receipt_mismatch: the
	// record named only the last that ran, and the admitted one was gone
	// from it).
	again, err := c.Activate(ctx, 0)
	want = sandbox.Retained{Activation: after.ID, NativeTurn: 1, Ended: sandbox.EndedNotRun, LastRan: ran.ID, Idle: []string{idle.ID, admitted.ID}}
	if err != nil || again.Previous == nil || !reflect.DeepEqual(*again.Previous, want) {
		t.Fatalf("two activations after the admitted one: %+v, %v; want previous %+v", again.Previous, err, want)
	}
	// A turn run ends the list: the next record names it as the last that ran.
	turn, err := c.Run(ctx, again.ID, []string{demoAgent}, "!events 1")
	if err != nil {
		t.Fatal(err)
	}
	drain(t, turn)
	turn.Close()
	last, err := c.Activate(ctx, 0)
	if err != nil || last.Previous == nil || last.Previous.Activation != again.ID || len(last.Previous.Idle) != 0 {
		t.Fatalf("after a turn ran: previous %+v, %v; want the record of %s with nothing idle", last.Previous, err, again.ID)
	}
}

// K13: a state of the previous release — a boundary, no record, no marker
// (StateVersionFile) — is taken over: the supervisor first records that
// its turns ran unrecorded (Unrecorded), then marks the state, before any
// activation's record. Activations that run nothing carry that on, across a
// restart; the first turn run ends it. From the marker on, a record gone
// is lost, never taken for the previous release's state again.
func TestPreviousReleaseStateIsTakenOver(t *testing.T) {
	dir := t.TempDir()
	ws, sock, state := filepath.Join(dir, "ws"), filepath.Join(dir, "s.sock"), filepath.Join(dir, "state")
	ctx := context.Background()
	c := &sandbox.Client{Socket: sock}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	// What a supervisor of the previous release leaves: its boundary only.
	if err := os.WriteFile(filepath.Join(state, sandbox.NativeTurnFile), []byte("3\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	p := startProc(t, ws, sock, "--state", state)
	p.lines.waitFor(t, RecordStateTakenOver)
	if b, err := os.ReadFile(filepath.Join(state, sandbox.StateVersionFile)); err != nil || strings.TrimSpace(string(b)) != "2" {
		t.Fatalf("state version after the take-over: %q, %v; want 2", b, err)
	}
	first, err := c.Activate(ctx, 0)
	takenOver := sandbox.Retained{NativeTurn: 3, Ended: sandbox.EndedNotRun, Unrecorded: true}
	if err != nil || first.Previous == nil || !reflect.DeepEqual(*first.Previous, takenOver) || first.NativeTurn != 3 {
		t.Fatalf("first activation over the previous release's state: %+v, %v; want previous %+v at native turn 3", first, err, takenOver)
	}
	second, err := c.Activate(ctx, 0) // the first ran nothing
	if want := (sandbox.Retained{Activation: first.ID, NativeTurn: 3, Ended: sandbox.EndedNotRun, Unrecorded: true}); err != nil || second.Previous == nil || !reflect.DeepEqual(*second.Previous, want) {
		t.Fatalf("after an activation that ran nothing: %+v, %v; want previous %+v", second.Previous, err, want)
	}
	p.kill()

	// Restarted over the marked state: no second take-over, the record of
	// the activation that ran nothing still says so.
	p = startProc(t, ws, sock, "--state", state)
	after, err := c.Activate(ctx, 0)
	if want := (sandbox.Retained{Activation: second.ID, NativeTurn: 3, Ended: sandbox.EndedNotRun, Idle: []string{first.ID}, Unrecorded: true}); err != nil || after.Previous == nil || !reflect.DeepEqual(*after.Previous, want) {
		t.Fatalf("after a restart: %+v, %v; want previous %+v", after.Previous, err, want)
	}
	turn, err := c.Run(ctx, after.ID, []string{demoAgent}, "!events 1")
	if err != nil {
		t.Fatal(err)
	}
	_, res := drain(t, turn)
	turn.Close()
	ran, err := c.Activate(ctx, 0)
	if want := (sandbox.Retained{Activation: after.ID, NativeTurn: res.NativeTurn, Ended: sandbox.EndedCompleted}); err != nil || ran.Previous == nil || !reflect.DeepEqual(*ran.Previous, want) {
		t.Fatalf("after a turn ran: %+v, %v; want previous %+v", ran.Previous, err, want)
	}
	if p.lines.contains(RecordStateTakenOver) {
		t.Error("a marked state was taken over again")
	}
	p.kill()

	// The record gone from the marked state: lost, not the previous
	// release's state.
	if err := os.Remove(filepath.Join(state, sandbox.RetainedFile)); err != nil {
		t.Fatal(err)
	}
	p = startProc(t, ws, sock, "--state", state)
	lost, err := c.Activate(ctx, 0)
	if err != nil || lost.Previous != nil || lost.NativeTurn != res.NativeTurn {
		t.Fatalf("a marked state without its record: %+v, %v; want no record at native turn %d", lost, err, res.NativeTurn)
	}
	if p.lines.contains(RecordStateTakenOver) {
		t.Error("a marked state whose record is gone was taken over")
	}
}

// A take-over cut short after its record and before the marker leaves a
// record and no marker: the next supervisor marks the state and presents
// that record; it does not take the state over again. A record file that
// cannot be read, without a marker, is no previous release's state either.
func TestInterruptedTakeOverKeepsItsRecord(t *testing.T) {
	for _, tt := range []struct {
		name, record string
		want         *sandbox.Retained
	}{
		{"take-over record, no marker", `{"native_turn":3,"ended":"not_run","unrecorded":true}`, &sandbox.Retained{NativeTurn: 3, Ended: sandbox.EndedNotRun, Unrecorded: true}},
		{"corrupt record, no marker", `{"native_tu`, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			for name, data := range map[string]string{sandbox.NativeTurnFile: "3\n", sandbox.RetainedFile: tt.record + "\n"} {
				if err := os.WriteFile(filepath.Join(state, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s := startServe(t, func(c *Config) { c.StateDir = state })
			act, err := s.c.Activate(context.Background(), 0)
			if err != nil || act.NativeTurn != 3 || (act.Previous == nil) != (tt.want == nil) || tt.want != nil && !reflect.DeepEqual(*act.Previous, *tt.want) {
				t.Fatalf("activation: %+v, %v; want previous %+v at native turn 3", act, err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(state, sandbox.StateVersionFile)); err != nil {
				t.Fatalf("the state was not marked: %v", err)
			}
			if s.rec.count(RecordStateTakenOver) != 0 {
				t.Error("the state was taken over again")
			}
		})
	}
}

// No record, no turn: a turn whose record cannot be written before the
// prompt is refused as not started, the prompt never reaching the agent
// (K13: a state taken over would otherwise still say that no turn ran).
func TestTurnNotStartedWithoutItsRecord(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	s := startServe(t, func(c *Config) { c.StateDir = state })
	ctx := context.Background()
	act, err := s.c.Activate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A directory where the record goes: it cannot be replaced, even by root.
	if err := os.Remove(filepath.Join(state, sandbox.RetainedFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(state, sandbox.RetainedFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "p"); !errors.Is(err, sandbox.ErrStartFailed) {
		t.Fatalf("run without its record: %v, want ErrStartFailed", err)
	}
	if got := transcript(t, s.ws); len(got) != 0 {
		t.Fatalf("a prompt reached the agent: %q", got)
	}
	// No token either while its record cannot be written: an admitted turn
	// of an activation that no record names would be judged on absence.
	if next, err := s.c.Activate(ctx, 0); err == nil {
		t.Fatalf("activation %s handed out without its record on disk", next.ID)
	}
	if err := os.Remove(filepath.Join(state, sandbox.RetainedFile)); err != nil {
		t.Fatal(err)
	}
	next, err := s.c.Activate(ctx, 0)
	if want := (sandbox.Retained{Activation: act.ID, NativeTurn: 0, Ended: sandbox.EndedNotRun}); err != nil || next.Previous == nil || !reflect.DeepEqual(*next.Previous, want) {
		t.Fatalf("after the refused turn and activation: %+v, %v; want previous %+v", next.Previous, err, want)
	}
	if b, err := os.ReadFile(filepath.Join(state, sandbox.RetainedFile)); err != nil || !strings.Contains(string(b), next.ID) {
		t.Fatalf("record on disk %q, %v; want the activation %s", b, err, next.ID)
	}
}
