package handover

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/fleet"
)

// startMiddle runs a stand-in daemon (mode middle-reattach,
// middle-preaccept or listener-v2) with envTestSocket set to sock, waits for
// the first ready line on their stdout and returns the pid it names, the
// process and the rest of the output.
func startMiddle(t *testing.T, mode, sock string) (int, *exec.Cmd) {
	pid, cmd, _ := startMiddleOutput(t, mode, sock)
	return pid, cmd
}

func startMiddleOutput(t *testing.T, mode, sock string) (int, *exec.Cmd, *bufio.Reader) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cmd := exec.Command(exe, childArg, mode)
	cmd.Env = append(os.Environ(), envTestSocket+"="+sock)
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r.SetReadDeadline(time.Now().Add(time.Minute)) // bounds a failure only
	br := bufio.NewReader(r)
	line, err := br.ReadString('\n')
	pid, perr := parseReady(line)
	if err != nil || perr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("stand-in: %q, %v", line, err)
	}
	return pid, cmd, br
}

// TestReattachBeforeAccept (P5, R33): a stand-in daemon with a re-attach
// socket is killed with SIGKILL before its child answered. The child must
// not begin a turn nobody knows of: its ACCEPT fails, it ends, and a new
// daemon finds nobody to re-attach to (the claim is resolved as never
// accepted).
func TestReattachBeforeAccept(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "att-42.sock")
	pid, middle, out := startMiddleOutput(t, "middle-preaccept", sock)
	middle.Process.Kill()
	middle.Wait()
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	if line, err := out.ReadString('\n'); line != "accept_refused\n" {
		t.Fatalf("the orphaned child said %q, %v; want accept_refused", line, err)
	}
	if err := awaitExit(pid); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "")
	cfg.Reattach = sock
	if _, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour)); !errors.Is(err, ErrNoChild) {
		t.Fatalf("Reattach after the child ended: %v, want ErrNoChild", err)
	}
}

// TestReattachAfterParentKill (P5): a stand-in daemon launches a child with
// a re-attach socket and is killed with SIGKILL after ACCEPT. The child
// outlives it (no parent-death tie), keeps its turn and waits on the
// socket, which is 0600; a new parent re-attaches with Reattach, the
// child's lease moves to the one REATTACH brings, its newest PROGRESS and
// then its RESULT arrive on the new connection, and the socket is removed
// once the child is gone.
func TestReattachAfterParentKill(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "att-42.sock")
	pid, middle := startMiddle(t, "middle-reattach", sock)
	middle.Process.Kill()
	middle.Wait()
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the child died with its parent: %v", err)
	}
	st, err := os.Stat(sock)
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Fatalf("re-attach socket %v, %v; want a 0600 socket", st.Mode(), err)
	}

	progress := newProgressLog()
	cfg := testConfig(t, "")
	cfg.Reattach = sock
	cfg.OnProgress = progress.add
	turn, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if turn.PID() != pid || turn.Orphaned() <= 0 {
		t.Errorf("re-attached to pid %d orphaned %v; want pid %d, orphaned for a while", turn.PID(), turn.Orphaned(), pid)
	}
	end := turn.Wait()
	if end.Outcome != OutcomeResult || string(end.Result) != "after false" {
		t.Fatalf("end %+v (%q), want the child's RESULT sent after re-attachment", end, end.Result)
	}
	if got := progress.all(); len(got) != 1 || got[0] != "before" {
		t.Errorf("progress after re-attachment %q, want the newest one again", got)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("re-attach socket still there after the child ended: %v", err)
	}
	if _, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour)); !errors.Is(err, ErrNoChild) {
		t.Errorf("second Reattach: %v, want ErrNoChild", err)
	}
}

// orphanedChild starts a stand-in daemon whose child (mode reattach)
// accepts with a re-attach socket, kills the stand-in with SIGKILL and
// returns the orphaned child's pid and its socket.
func orphanedChild(t *testing.T) (int, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "att-42.sock")
	pid, middle := startMiddle(t, "middle-reattach", sock)
	middle.Process.Kill()
	middle.Wait()
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	return pid, sock
}

// TestReattachSilentChildIsNotGone (P5, R34, K5): an orphaned child that
// does not answer REATTACH — frozen with SIGSTOP — is no evidence that it
// is gone: Reattach says *Unattached, never ErrNoChild, and Alive says it
// may be running. Once it runs again, a second Reattach takes its turn
// over, and its RESULT arrives; after its exit Alive says it is gone.
func TestReattachSilentChildIsNotGone(t *testing.T) {
	pid, sock := orphanedChild(t)
	if err := fleet.Freeze(pid, time.Minute); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "")
	cfg.Reattach = sock
	cfg.StopGrace = 300 * time.Millisecond
	var ua *Unattached
	for range 8 { // more tries than the listener's backlog holds
		_, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour))
		if errors.Is(err, ErrNoChild) || !errors.As(err, &ua) {
			t.Fatalf("Reattach to a frozen child: %v, want *Unattached", err)
		}
		if !ua.Alive() {
			t.Fatalf("Alive() = false for the frozen child %d (%v)", pid, ua)
		}
	}
	if ua.PID != pid && ua.PID != 0 {
		t.Errorf("Unattached names pid %d, want %d", ua.PID, pid)
	}
	if err := syscall.Kill(-pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	cfg.StopGrace = 30 * time.Second // bounds a failure only
	var turn *Turn
	for try := 1; turn == nil; try++ {
		tu, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour))
		switch {
		case err == nil:
			turn = tu
		case errors.As(err, &ua) && try < 20:
			// The thawed child first drains the connections it was sent
			// while frozen (their daemon has gone); a full backlog says so.
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("Reattach to the thawed child (try %d): %v", try, err)
		}
	}
	if end := turn.Wait(); end.Outcome != OutcomeResult || string(end.Result) != "after false" {
		t.Fatalf("end %+v (%q), want the child's RESULT after re-attachment", end, end.Result)
	}
	if err := awaitExit(pid); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatal(err)
	}
	if ua.PID = pid; ua.Alive() {
		t.Errorf("Alive() = true after the child %d exited", pid)
	}
}

// TestReattachWithDescriptorsExhausted (P5, K5): a daemon out of
// descriptors (EMFILE: a stand-in daemon with RLIMIT_NOFILE lowered and
// filled, so that the test process keeps its own) cannot open the socket,
// the pidfd or the epoll set: each such try is *Unattached with the child
// alive, never ErrNoChild, and once descriptors are free again the same
// daemon re-attaches and gets the turn's RESULT.
func TestReattachWithDescriptorsExhausted(t *testing.T) {
	pid, sock := orphanedChild(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // bounds a failure only
	defer cancel()
	daemon := exec.CommandContext(ctx, exe, childArg, "reattach-emfile")
	daemon.Env = append(os.Environ(), envTestSocket+"="+sock)
	daemon.Stderr = os.Stderr
	b, err := daemon.Output()
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if err != nil {
		t.Fatalf("stand-in daemon: %v; it said %q", err, lines)
	}
	unattached := 0
	for _, l := range lines {
		switch {
		case l == "no_child", strings.HasPrefix(l, "other"), strings.HasSuffix(l, "alive=false"):
			t.Fatalf("a daemon out of descriptors took the live child %d for gone: %q", pid, lines)
		case strings.HasPrefix(l, "unattached"):
			unattached++
		}
	}
	t.Logf("stand-in daemon: %q", lines)
	if unattached == 0 || len(lines) < 2 || lines[len(lines)-2] != "reattached" || lines[len(lines)-1] != "end result after false" {
		t.Fatalf("stand-in daemon said %q; want unattached tries, then reattached and the child's RESULT", lines)
	}
}

// TestReattachRefusesOtherVersion: a child that answers REATTACH in a
// protocol version this daemon does not speak is not re-attached; it is
// stopped (SIGTERM, then SIGKILL after KillGrace).
func TestReattachRefusesOtherVersion(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "att-42.sock")
	_, child := startMiddle(t, "listener-v2", sock)
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	cfg := testConfig(t, "")
	cfg.Reattach = sock
	cfg.KillGrace = 100 * time.Millisecond
	_, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Version != 2 {
		child.Process.Kill()
		t.Fatalf("Reattach: %v, want a VersionError for version 2", err)
	}
	err = <-done
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child of another version ended with %v, want SIGKILL", err)
	}
}

// TestReattachNobodyThere: no socket, or one nobody listens on, is
// ErrNoChild.
func TestReattachNobodyThere(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.Reattach = filepath.Join(t.TempDir(), "none.sock")
	if _, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour)); !errors.Is(err, ErrNoChild) {
		t.Fatalf("no socket: %v", err)
	}
	f, err := bindReattach(cfg.Reattach) // bound, never listened on: a dead child's
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Reattach(t.Context(), cfg, testPayload().Echo, testLease(time.Hour)); !errors.Is(err, ErrNoChild) {
		t.Fatalf("nobody listening: %v", err)
	}
}

// awaitExit returns once process pid, not necessarily the test's child, has
// exited; an error if there is no such process.
func awaitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	return awaitExited(f)
}
