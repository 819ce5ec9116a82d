package handover

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
)

// testConfig starts the test binary as a child in the given mode. The
// graces are long: tests that need them to expire shorten them.
func testConfig(t *testing.T, mode string) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Path:             exe,
		Args:             []string{childArg, mode},
		Stderr:           os.Stderr,
		ExecutionTimeout: 2 * time.Minute, // a hung test fails instead of hanging
		StopGrace:        30 * time.Second,
		KillGrace:        30 * time.Second,
	}
}

// progressLog collects PROGRESS bodies.
type progressLog struct {
	mu     sync.Mutex
	bodies []string
	first  chan string // gets the first body
}

func newProgressLog() *progressLog { return &progressLog{first: make(chan string, 1)} }

func (p *progressLog) add(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bodies) == 0 {
		p.first <- string(b)
	}
	p.bodies = append(p.bodies, string(b))
}

func (p *progressLog) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.bodies)
}

func notAccepted(t *testing.T, turn *Turn, err error) *NotAccepted {
	t.Helper()
	var na *NotAccepted
	if !errors.As(err, &na) {
		if turn != nil {
			turn.Stop()
			turn.Wait()
		}
		t.Fatalf("Launch = %v, %v; want a *NotAccepted", turn, err)
	}
	if turn != nil {
		t.Fatalf("Launch returned a turn with its error")
	}
	return na
}

func signaled(ps *os.ProcessState, sig syscall.Signal) bool {
	ws, ok := waitStatus(ps)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// TestChildKilledAtEachStage kills the child at every stage of its turn and
// checks the parent's verdict: before ACCEPT the claim may be released
// (R33); once the parent has read ACCEPT it may not, and the end is the
// lease protocol's (R35).
func TestChildKilledAtEachStage(t *testing.T) {
	t.Run("before reading the payload", func(t *testing.T) {
		t.Parallel()
		turn, err := Launch(t.Context(), testConfig(t, "die-before-payload"), testPayload())
		na := notAccepted(t, turn, err)
		// The payload write races the death: either proof will do.
		if na.Outcome != OutcomePayloadUndelivered && !(na.Outcome == OutcomeDeclined && na.Class == ClassClosed) {
			t.Fatalf("outcome %v (%s), want payload_undelivered or declined (closed)", na.Outcome, na.Class)
		}
		if r, ok := na.Release(); !ok || !r.Valid() {
			t.Fatalf("no release offered for %v", na.Outcome)
		}
		if !signaled(na.State, syscall.SIGKILL) {
			t.Fatalf("child state %v, want killed", na.State)
		}
	})
	t.Run("after the payload before ACCEPT", func(t *testing.T) {
		t.Parallel()
		turn, err := Launch(t.Context(), testConfig(t, "die-after-payload"), testPayload())
		na := notAccepted(t, turn, err)
		if na.Outcome != OutcomeDeclined || na.Class != ClassClosed {
			t.Fatalf("outcome %v (%s), want declined (closed)", na.Outcome, na.Class)
		}
		r, ok := na.Release()
		if !ok || r.Class() != "declined:closed" {
			t.Fatalf("release %v %q, want declined:closed", ok, r.Class())
		}
	})
	for _, tc := range []struct {
		name, mode string
		progress   []string
	}{
		{"right after ACCEPT", "die-after-accept", nil},
		{"mid-stream", "die-mid-stream", []string{"event 1"}},
		{"after its work before RESULT", "die-before-result", []string{"event 1", "settled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			progress := newProgressLog()
			cfg := testConfig(t, tc.mode)
			cfg.OnProgress = progress.add
			turn, err := Launch(t.Context(), cfg, testPayload())
			if err != nil {
				// An accepted turn has no NotAccepted, hence no Releasable.
				t.Fatalf("Launch: %v; want accepted", err)
			}
			end := turn.Wait()
			if end.Outcome != OutcomeKilled || end.Signal != syscall.SIGKILL || end.ExitCode != -1 {
				t.Fatalf("end %+v, want killed by SIGKILL", end)
			}
			if end.Result != nil || end.Stopped || end.TimedOut {
				t.Fatalf("end %+v: no result, not stopped, not timed out expected", end)
			}
			if got := progress.all(); !slices.Equal(got, tc.progress) {
				t.Fatalf("progress %q, want %q", got, tc.progress)
			}
		})
	}
}

// TestLaunchSpawnFailed: a missing executable is proof (R33).
func TestLaunchSpawnFailed(t *testing.T) {
	cfg := testConfig(t, "unused")
	cfg.Path = "/nonexistent/runnerd-handover-test"
	turn, err := Launch(t.Context(), cfg, testPayload())
	na := notAccepted(t, turn, err)
	if na.Outcome != OutcomeSpawnFailed || na.State != nil {
		t.Fatalf("outcome %v state %v, want spawn_failed, no process", na.Outcome, na.State)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("error %v does not say the executable is missing", err)
	}
	r, ok := na.Release()
	if !ok || r.Class() != "spawn_failed" || r.Outcome() != OutcomeSpawnFailed {
		t.Fatalf("release %v %q, want spawn_failed", ok, r.Class())
	}
}

// TestLaunchPayloadUndelivered: the child dies before it reads a payload
// larger than the socket buffer, so the write fails (R33).
func TestLaunchPayloadUndelivered(t *testing.T) {
	p := testPayload()
	p.Data = bytes.Repeat([]byte("x"), 2<<20)
	turn, err := Launch(t.Context(), testConfig(t, "die-before-payload"), p)
	na := notAccepted(t, turn, err)
	if na.Outcome != OutcomePayloadUndelivered {
		t.Fatalf("outcome %v (%s), want payload_undelivered", na.Outcome, na.Class)
	}
	if r, ok := na.Release(); !ok || r.Class() != "payload_undelivered" {
		t.Fatalf("release %v %q, want payload_undelivered", ok, r.Class())
	}
}

// TestLaunchInvalidPayloadNeverSpawns: a payload that cannot be framed is
// undelivered without a child.
func TestLaunchInvalidPayloadNeverSpawns(t *testing.T) {
	p := testPayload()
	p.AttemptID = "has space"
	turn, err := Launch(t.Context(), testConfig(t, "silent"), p)
	na := notAccepted(t, turn, err)
	if na.Outcome != OutcomePayloadUndelivered || na.Class != ClassPayloadInvalid || na.State != nil {
		t.Fatalf("got %v (%s) state %v, want payload_undelivered (payload_invalid) without a child", na.Outcome, na.Class, na.State)
	}
}

// TestLaunchDeclined: an explicit DECLINE (a failed read-only preflight) and
// a descriptor closed without ACCEPT are both proof (R33).
func TestLaunchDeclined(t *testing.T) {
	for _, tc := range []struct{ name, mode, class string }{
		{"preflight failed", "decline", "preflight_failed"},
		{"closed without ACCEPT", "close-no-accept", ClassClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			turn, err := Launch(t.Context(), testConfig(t, tc.mode), testPayload())
			na := notAccepted(t, turn, err)
			if na.Outcome != OutcomeDeclined || na.Class != tc.class {
				t.Fatalf("outcome %v (%s), want declined (%s)", na.Outcome, na.Class, tc.class)
			}
			if !na.State.Success() {
				t.Fatalf("child state %v, want a clean exit", na.State)
			}
			if r, ok := na.Release(); !ok || r.Class() != "declined:"+tc.class {
				t.Fatalf("release %v %q, want declined:%s", ok, r.Class(), tc.class)
			}
		})
	}
}

// TestSilentChildNeverReleased: a child that reads its payload and stays
// alive and silent is no proof (R34). Launch waits until the execution
// timeout (R5) ends it, and that is a failure, not a release.
func TestSilentChildNeverReleased(t *testing.T) {
	cfg := testConfig(t, "silent")
	cfg.ExecutionTimeout = 400 * time.Millisecond
	cfg.StopGrace = 50 * time.Millisecond // expires: the child ignores STOP; it dies of SIGTERM
	start := time.Now()
	turn, err := Launch(t.Context(), cfg, testPayload())
	na := notAccepted(t, turn, err)
	if elapsed := time.Since(start); elapsed < cfg.ExecutionTimeout {
		t.Fatalf("Launch answered after %v, before the %v execution timeout", elapsed, cfg.ExecutionTimeout)
	}
	if na.Outcome != OutcomeUnconfirmed || na.Class != ClassExecutionTimeout {
		t.Fatalf("outcome %v (%s), want unconfirmed (execution_timeout)", na.Outcome, na.Class)
	}
	if r, ok := na.Release(); ok || r.Valid() || r.Class() != "" {
		t.Fatalf("release offered for a silent live child: %v %q", ok, r.Class())
	}
	// Launch returns only once the child is gone: it was alive all along.
	if !signaled(na.State, syscall.SIGTERM) {
		t.Fatalf("child state %v, want ended by our SIGTERM", na.State)
	}
}

// TestStopBeforeAnswerNeverReleased: Stop through the launch context while
// the child is silent is no proof either (R34).
func TestStopBeforeAnswerNeverReleased(t *testing.T) {
	cfg := testConfig(t, "silent")
	cfg.StopGrace = 50 * time.Millisecond
	cfg.KillGrace = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	turn, err := Launch(ctx, cfg, testPayload())
	na := notAccepted(t, turn, err)
	if na.Outcome != OutcomeUnconfirmed || na.Class != ClassStopped {
		t.Fatalf("outcome %v (%s), want unconfirmed (stopped)", na.Outcome, na.Class)
	}
	if _, ok := na.Release(); ok {
		t.Fatal("release offered for a child stopped before it answered")
	}
}

// TestProtocolErrorsBeforeAcceptNeverReleased: an ACCEPT for another
// attempt or generation, or a frame out of order, is no proof.
func TestProtocolErrorsBeforeAcceptNeverReleased(t *testing.T) {
	for _, tc := range []struct{ name, mode, class string }{
		{"wrong echo", "bad-echo", ClassBadEcho},
		{"PROGRESS before ACCEPT", "progress-before-accept", ClassProtocol},
		{"ACCEPT after DECLINE", "decline-then-accept", ClassProtocol},
		{"DEADLINE from the child", "deadline-from-child", ClassProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, tc.mode)
			cfg.StopGrace = 50 * time.Millisecond
			cfg.KillGrace = 50 * time.Millisecond
			turn, err := Launch(t.Context(), cfg, testPayload())
			na := notAccepted(t, turn, err)
			if na.Outcome != OutcomeUnconfirmed || na.Class != tc.class || !errors.Is(err, na.Err) || na.Err == nil {
				t.Fatalf("outcome %v (%s) err %v, want unconfirmed (%s) with the cause", na.Outcome, na.Class, na.Err, tc.class)
			}
			if _, ok := na.Release(); ok {
				t.Fatal("release offered after a protocol error")
			}
			if na.State == nil || na.State.Exited() {
				t.Fatalf("child state %v, want killed by the parent", na.State)
			}
		})
	}
}

// TestTurnEnds: the ends of an accepted turn other than kills.
func TestTurnEnds(t *testing.T) {
	t.Run("result", func(t *testing.T) {
		t.Parallel()
		progress := newProgressLog()
		cfg := testConfig(t, "result")
		cfg.OnProgress = progress.add
		turn, err := Launch(t.Context(), cfg, testPayload())
		if err != nil {
			t.Fatal(err)
		}
		end := turn.Wait()
		if end.Outcome != OutcomeResult || string(end.Result) != "done" || end.ExitCode != 0 || end.Err != nil {
			t.Fatalf("end %+v, want result \"done\", exit 0", end)
		}
		if got, want := progress.all(), []string{"event 1", "event 2", "event 3"}; !slices.Equal(got, want) {
			t.Fatalf("progress %q, want %q", got, want)
		}
	})
	t.Run("exited without result", func(t *testing.T) {
		t.Parallel()
		turn, err := Launch(t.Context(), testConfig(t, "exit-no-result"), testPayload())
		if err != nil {
			t.Fatal(err)
		}
		if end := turn.Wait(); end.Outcome != OutcomeExitedWithoutResult || end.ExitCode != 3 {
			t.Fatalf("end %+v, want exited without result, code 3", end)
		}
	})
	t.Run("frame after RESULT", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, "after-result")
		cfg.StopGrace = 50 * time.Millisecond // expires: the child ignores STOP; it dies of SIGTERM
		turn, err := Launch(t.Context(), cfg, testPayload())
		if err != nil {
			t.Fatal(err)
		}
		end := turn.Wait()
		if end.Outcome != OutcomeResult || string(end.Result) != "done" || end.Err == nil || end.Signal != syscall.SIGTERM {
			t.Fatalf("end %+v, want the result kept, the protocol error reported and the child stopped", end)
		}
	})
	t.Run("execution timeout after ACCEPT", func(t *testing.T) {
		t.Parallel()
		cfg := testConfig(t, "hang-accepted") // ignores STOP and SIGTERM
		cfg.StopGrace = 50 * time.Millisecond
		cfg.KillGrace = 50 * time.Millisecond
		// The timeout must come after ACCEPT: on a machine too loaded for
		// the child to accept within one, try a longer one.
		var turn *Turn
		for _, timeout := range []time.Duration{300 * time.Millisecond, time.Second, 5 * time.Second, 20 * time.Second} {
			cfg.ExecutionTimeout = timeout
			var err error
			turn, err = Launch(t.Context(), cfg, testPayload())
			var na *NotAccepted
			if errors.As(err, &na) && na.Class == ClassExecutionTimeout {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if turn == nil {
			t.Fatal("the child never accepted before its execution timeout")
		}
		end := turn.Wait()
		if end.Outcome != OutcomeKilled || end.Signal != syscall.SIGKILL || !end.TimedOut || end.Stopped {
			t.Fatalf("end %+v, want killed by SIGKILL on the execution timeout", end)
		}
	})
}

// TestStopIsDeliveredAsFrame: a cooperative child gets STOP on its
// descriptor and answers with a RESULT before any signal.
func TestStopIsDeliveredAsFrame(t *testing.T) {
	progress := newProgressLog()
	cfg := testConfig(t, "proc")
	cfg.OnProgress = progress.add
	turn, err := Launch(t.Context(), cfg, testPayload())
	if err != nil {
		t.Fatal(err)
	}
	<-progress.first
	turn.StopWith("lease_lost")
	turn.Stop() // only the first counts
	end := turn.Wait()
	if end.Outcome != OutcomeResult || string(end.Result) != "stopped: lease_lost" || !end.Stopped || end.ExitCode != 0 {
		t.Fatalf("end %+v, want the child's RESULT to STOP and a clean exit", end)
	}
}

// TestCancelledLaunchCarriesItsStopClass: the STOP that cancelling
// Launch's context sends carries the class of a StopCause (a user's cancel
// that came before ACCEPT is "cancelled", not "stopped"); any other cause
// stops it as "stopped".
func TestCancelledLaunchCarriesItsStopClass(t *testing.T) {
	for _, tt := range []struct {
		cause error
		want  string
	}{
		{StopCause{Class: "cancelled"}, "stopped: cancelled"},
		{StopCause{Class: "not a class!"}, "stopped: stopped"},
		{errors.New("the daemon's own reason"), "stopped: stopped"},
		{nil, "stopped: stopped"},
	} {
		progress := newProgressLog()
		cfg := testConfig(t, "proc")
		cfg.OnProgress = progress.add
		ctx, cancel := context.WithCancelCause(t.Context())
		turn, err := Launch(ctx, cfg, testPayload())
		if err != nil {
			t.Fatal(err)
		}
		<-progress.first
		cancel(tt.cause)
		end := turn.Wait()
		if end.Outcome != OutcomeResult || string(end.Result) != tt.want || !end.Stopped {
			t.Errorf("cause %v: end %+v (result %q), want the child's RESULT %q", tt.cause, end, end.Result, tt.want)
		}
	}
}

// TestPayloadNotInArgvOrEnvironment reads the live child's
// /proc/<pid>/cmdline and environ: the payload, which carries the worker
// token, is in neither; the environment is filtered and names the
// descriptor once; the child unset that variable for itself.
func TestPayloadNotInArgvOrEnvironment(t *testing.T) {
	progress := newProgressLog()
	cfg := testConfig(t, "proc")
	cfg.OnProgress = progress.add
	cfg.Env = []string{"PATH=/usr/bin:/bin", "NOTIFY_SOCKET=/run/systemd/notify", "WATCHDOG_USEC=30000000",
		"WATCHDOG_PID=1", "LISTEN_FDS=2", "LISTEN_PID=1", EnvFD + "=9", "KEEP=me"}
	turn, err := Launch(t.Context(), cfg, testPayload())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { turn.Stop(); turn.Wait() }()
	if got := <-progress.first; got != "ready env_fd_set=false" {
		t.Fatalf("child says %q; want it to have unset %s", got, EnvFD)
	}
	pid := strconv.Itoa(turn.PID())
	cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"cmdline": cmdline, "environ": environ} {
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, testPayload().Data) {
			t.Errorf("the payload is visible in /proc/%s/%s", pid, name)
		}
	}
	if got, want := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00"), append([]string{cfg.Path}, cfg.Args...); !slices.Equal(got, want) {
		t.Errorf("cmdline %q, want %q", got, want)
	}
	env := strings.Split(strings.TrimSuffix(string(environ), "\x00"), "\x00")
	if want := []string{"PATH=/usr/bin:/bin", "KEEP=me", EnvFD + "=3"}; !slices.Equal(env, want) {
		t.Errorf("environ %q, want %q", env, want)
	}
}

// TestChildInheritsOnlyDescriptorsZeroToThree: the child lists
// /proc/self/fd before it touches its descriptor. Even a descriptor the
// parent holds without close-on-exec (as one inherited from systemd would
// be) does not reach it. The Go runtime opens a few descriptors of its own
// after exec, all close-on-exec; inherited ones cannot be, so close-on-exec
// tells them apart.
func TestChildInheritsOnlyDescriptorsZeroToThree(t *testing.T) {
	planted, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(planted)
	turn, err := Launch(t.Context(), testConfig(t, "fds"), testPayload())
	if err != nil {
		t.Fatal(err)
	}
	end := turn.Wait()
	if end.Outcome != OutcomeResult {
		t.Fatalf("end %+v, want a result", end)
	}
	var fds []fdInfo
	if err := json.Unmarshal(end.Result, &fds); err != nil {
		t.Fatal(err)
	}
	var inherited []int
	for _, f := range fds {
		if !f.CloseOnExec {
			inherited = append(inherited, f.FD)
		}
		if f.FD == 3 && !strings.HasPrefix(f.Target, "socket:") {
			t.Errorf("fd 3 is %q, want the handover socket", f.Target)
		}
	}
	if !slices.Equal(inherited, []int{0, 1, 2, 3}) {
		t.Fatalf("child inherited descriptors %v, want [0 1 2 3]; all: %+v (planted fd %d)", inherited, fds, planted)
	}
}

// TestStopKillsProcessGroup: a child and its grandchild both ignore STOP and
// SIGTERM; Stop ends them both. Their shared stdout pipe reaching EOF proves
// the grandchild is gone too.
func TestStopKillsProcessGroup(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	progress := newProgressLog()
	cfg := testConfig(t, "group")
	cfg.Stdout = w
	cfg.OnProgress = progress.add
	cfg.StopGrace = 50 * time.Millisecond
	cfg.KillGrace = 50 * time.Millisecond
	turn, err := Launch(t.Context(), cfg, testPayload())
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	gpid, err := strconv.Atoi(<-progress.first)
	if err != nil {
		t.Fatal(err)
	}
	if pgid, err := syscall.Getpgid(turn.PID()); err != nil || pgid != turn.PID() {
		t.Fatalf("child %d in process group %d (%v), want its own", turn.PID(), pgid, err)
	}
	if pgid, err := syscall.Getpgid(gpid); err != nil || pgid != turn.PID() {
		t.Fatalf("grandchild %d in process group %d (%v), want the child's", gpid, pgid, err)
	}
	turn.Stop()
	end := turn.Wait()
	if end.Outcome != OutcomeKilled || end.Signal != syscall.SIGKILL || !end.Stopped {
		t.Fatalf("end %+v, want killed by SIGKILL after Stop", end)
	}
	r.SetReadDeadline(time.Now().Add(time.Minute)) // bounds a failure; success is immediate
	if n, err := io.Copy(io.Discard, r); err != nil || n != 0 {
		syscall.Kill(gpid, syscall.SIGKILL)
		t.Fatalf("grandchild %d still holds the pipe: %d bytes, %v", gpid, n, err)
	}
}

// TestChildThatClosesItsEndIsKilled: an accepted child closes its end and
// lives on, deaf to SIGTERM. EOF comes long before its exit: the parent
// still runs the stop sequence, kills it and reaps it.
func TestChildThatClosesItsEndIsKilled(t *testing.T) {
	cfg := testConfig(t, "close-and-hang")
	cfg.StopGrace, cfg.KillGrace = 50*time.Millisecond, 50*time.Millisecond
	turn, err := Launch(t.Context(), cfg, testPayload())
	if err != nil {
		t.Fatal(err)
	}
	end := turn.Wait()
	if end.Outcome != OutcomeKilled || end.Signal != syscall.SIGKILL || end.Stopped || end.TimedOut {
		t.Fatalf("end %+v, want killed by SIGKILL, neither stopped nor timed out", end)
	}
	if err := syscall.Kill(turn.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("child %d after Wait: kill 0 = %v, want ESRCH (reaped)", turn.PID(), err)
	}
}

// TestEndHeldOpenAfterExit: a descendant outside the child's process group
// holds the child's end after the child sent its RESULT and exited, so EOF
// never comes. The parent sees the exit anyway and ends the turn with the
// child's result and status, not at the execution timeout.
func TestEndHeldOpenAfterExit(t *testing.T) {
	progress := newProgressLog()
	cfg := testConfig(t, "stray-holder")
	cfg.OnProgress = progress.add
	cfg.KillGrace = 100 * time.Millisecond
	cfg.ExecutionTimeout = time.Minute // what a parent blind to the exit would wait for
	turn, err := Launch(t.Context(), cfg, testPayload())
	if err != nil {
		t.Fatal(err)
	}
	gpid, err := strconv.Atoi(<-progress.first)
	if err != nil {
		turn.Stop()
		turn.Wait()
		t.Fatal(err)
	}
	defer syscall.Kill(gpid, syscall.SIGKILL)
	end := turn.Wait()
	if end.Outcome != OutcomeResult || string(end.Result) != "done" || end.ExitCode != 0 || end.TimedOut || end.Stopped {
		t.Fatalf("end %+v, want the result, exit code 0, no timeout", end)
	}
	if err := syscall.Kill(gpid, 0); err != nil {
		t.Fatalf("the holder %d is gone (%v): the test proves nothing", gpid, err)
	}
}

// TestParentDeath starts a stand-in daemon that launches a child, then
// kills the daemon with SIGKILL.
func TestParentDeath(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, mode string) (pid int, rest *bufio.Reader) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		middle := exec.Command(exe, childArg, mode)
		middle.Stdout, middle.Stderr = w, os.Stderr
		if err := middle.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		r.SetReadDeadline(time.Now().Add(time.Minute)) // bounds a failure only
		br := bufio.NewReader(r)
		line, err := br.ReadString('\n')
		if err != nil {
			middle.Process.Kill()
			middle.Wait()
			t.Fatalf("stand-in daemon: %q, %v", line, err)
		}
		if pid, err = parseReady(line); err != nil {
			t.Fatalf("stand-in daemon said %q", line)
		}
		middle.Process.Kill()
		middle.Wait()
		return pid, br
	}
	// The child sees EOF on its descriptor (no parent-death signal here).
	t.Run("child sees EOF", func(t *testing.T) {
		t.Parallel()
		pid, br := run(t, "middle")
		line, err := br.ReadString('\n')
		if line != "parent_gone\n" {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child said %q, %v; want parent_gone", line, err)
		}
	})
	// Without a re-attach socket a child that has accepted ends its turn
	// on EOF; nothing kills it on its parent's death but itself (P5).
}

// parseReady reads the stand-in daemon's "ready <pid>" line.
func parseReady(line string) (int, error) {
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "ready" {
		return 0, errors.New("not a ready line")
	}
	return strconv.Atoi(f[1])
}

// TestReleasableZeroValue: the only Releasable another package can make is
// no permission.
func TestReleasableZeroValue(t *testing.T) {
	var r Releasable
	if r.Valid() || r.Class() != "" || r.Outcome() != 0 {
		t.Fatalf("zero Releasable = %v %q %v, want no permission", r.Valid(), r.Class(), r.Outcome())
	}
	for _, o := range []Outcome{OutcomeUnconfirmed, OutcomeAccepted, OutcomeResult, OutcomeExitedWithoutResult, OutcomeKilled} {
		if _, ok := (&NotAccepted{Outcome: o}).Release(); ok {
			t.Errorf("%v offers a release", o)
		}
	}
}

// TestConfigDefaults: zero fields mean the defaults, among them the
// 3,600 s execution timeout (R5); a re-attach socket is named to the child.
func TestConfigDefaults(t *testing.T) {
	c := Config{Env: []string{}}.withDefaults()
	if c.ExecutionTimeout != 3600*time.Second || c.StopGrace != DefaultStopGrace || c.KillGrace != DefaultKillGrace {
		t.Fatalf("defaults %+v", c)
	}
	if got := childEnv(c.Env, false); !slices.Equal(got, []string{EnvFD + "=3"}) {
		t.Fatalf("environment %q", got)
	}
	if got := childEnv([]string{EnvReattachFD + "=9"}, true); !slices.Equal(got, []string{EnvReattachFD + "=4", EnvFD + "=3"}) {
		t.Fatalf("environment with a re-attach socket %q", got)
	}
}

// TestDeadlineFramesReachChild (K5): leases given to Config.Leases reach the
// child as DEADLINE frames — one sent before ACCEPT too — and the child's
// Deadlines ends at the newest lease's deadline, not before.
func TestDeadlineFramesReachChild(t *testing.T) {
	progress := newProgressLog()
	cfg := testConfig(t, "lease-echo")
	cfg.OnProgress = progress.add
	leases := make(chan Lease, 1)
	cfg.Leases = leases
	now := boottime.Now()
	p := testPayload()
	p.Lease = Lease{Sent: now, Deadline: now.Add(time.Hour)}
	first := Lease{Sent: now.Add(time.Millisecond), Deadline: now.Add(time.Hour + time.Millisecond)}
	leases <- first // before ACCEPT: the child waits for it to accept
	turn, err := Launch(t.Context(), cfg, p)
	if err != nil {
		t.Fatal(err)
	}
	<-progress.first
	second := Lease{Sent: now.Add(2 * time.Millisecond), Deadline: boottime.Now().Add(300 * time.Millisecond)}
	leases <- second
	end := turn.Wait()
	if end.Outcome != OutcomeResult || string(end.Result) != ErrLeaseExpired.Error() {
		t.Fatalf("end %+v (%s), want RESULT %q", end, end.Result, ErrLeaseExpired)
	}
	if now := boottime.Now(); now.Before(second.Deadline) {
		t.Fatalf("the child's lease ended %v before its deadline", second.Deadline.Sub(now))
	}
	want := []string{fmt.Sprintf("%d %d", first.Sent, first.Deadline), fmt.Sprintf("%d %d", second.Sent, second.Deadline)}
	if got := progress.all(); !slices.Equal(got, want) {
		t.Fatalf("leases seen by the child %q, want %q", got, want)
	}
}
