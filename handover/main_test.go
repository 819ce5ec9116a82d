package handover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/internal/boottime"
)

// childArg re-enters the test binary as a handover child (style item 8):
// argv is [test binary, childArg, mode].
const childArg = "handover-test-child"

func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == childArg {
		os.Exit(childMain(os.Args[2]))
	}
	goleak.VerifyTestMain(m)
}

// die is the child killed at its current stage.
func die() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	hang()
}

// hang keeps a process alive and silent until something kills it.
func hang() {
	for {
		time.Sleep(time.Hour)
	}
}

type fdInfo struct {
	FD          int    `json:"fd"`
	Target      string `json:"target"`
	CloseOnExec bool   `json:"cloexec"`
}

// listFDs reports the process's open descriptors, without the one it uses
// to read the listing.
func listFDs() ([]fdInfo, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	self := int(d.Fd())
	var out []fdInfo
	for _, name := range names {
		n, err := strconv.Atoi(name)
		if err != nil || n == self {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		if err != nil {
			continue
		}
		target, _ := os.Readlink("/proc/self/fd/" + name)
		out = append(out, fdInfo{FD: n, Target: target, CloseOnExec: flags&unix.FD_CLOEXEC != 0})
	}
	return out, nil
}

// exitParentGone is the exit status of a parent-gone child that saw its
// descriptor's EOF before any payload.
const exitParentGone = 7

func childMain(mode string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "handover test child %s: %v\n", mode, err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	var fds []fdInfo
	switch mode {
	case "die-before-payload":
		die()
	case "grandchild":
		signal.Ignore(syscall.SIGTERM)
		hang()
	case "middle", "middle-reattach", "middle-preaccept":
		return middleMain(exe, mode)
	case "listener-v2":
		return listenerV2()
	case "reattach-emfile":
		return reattachEMFILE()
	case "fds":
		// Before OpenFD, which replaces fd 3 by a close-on-exec duplicate.
		if fds, err = listFDs(); err != nil {
			return fail(err)
		}
	}

	ch, err := OpenFromEnv()
	if mode == "parent-gone" && errors.Is(err, ErrParentGone) {
		return exitParentGone
	}
	if err != nil {
		return fail(err)
	}
	defer ch.Close()
	must := func(err error) {
		if err != nil {
			fmt.Fprintf(os.Stderr, "handover test child %s: %v\n", mode, err)
			os.Exit(2)
		}
	}
	switch mode {
	case "die-after-payload":
		die()
	case "die-after-accept":
		must(ch.Accept())
		die()
	case "die-mid-stream":
		must(ch.Accept())
		must(ch.Progress([]byte("event 1")))
		die()
	case "die-before-result":
		must(ch.Accept())
		must(ch.Progress([]byte("event 1")))
		must(ch.Progress([]byte("settled")))
		die()
	case "result":
		must(ch.Accept())
		for i := 1; i <= 3; i++ {
			must(ch.Progress(fmt.Appendf(nil, "event %d", i)))
		}
		must(ch.Result([]byte("done")))
		return 0
	case "exit-no-result":
		must(ch.Accept())
		return 3
	case "decline":
		must(ch.Decline("preflight_failed"))
		return 0
	case "close-no-accept":
		return 0
	case "silent":
		hang()
	case "bad-echo":
		e := ch.Payload().Echo
		e.LeaseGeneration++
		body, _ := appendEcho(nil, e)
		must(writeFrame(ch.conn, FrameAccept, body))
		hang()
	case "progress-before-accept":
		must(writeFrame(ch.conn, FrameProgress, []byte("too early")))
		hang()
	case "deadline-from-child":
		// DEADLINE is the parent's frame only.
		body, _ := encodeDeadline(ch.Payload().Echo, Lease{Sent: 1, Deadline: 2})
		must(writeFrame(ch.conn, FrameDeadline, body))
		hang()
	case "decline-then-accept":
		must(ch.Decline("preflight_failed"))
		body, _ := appendEcho(nil, ch.Payload().Echo)
		must(writeFrame(ch.conn, FrameAccept, body))
		hang()
	case "after-result":
		must(ch.Accept())
		must(ch.Result([]byte("done")))
		must(writeFrame(ch.conn, FrameProgress, []byte("too late")))
		hang()
	case "hang-accepted":
		signal.Ignore(syscall.SIGTERM)
		must(ch.Accept())
		hang()
	case "fds":
		must(ch.Accept())
		b, _ := json.Marshal(fds)
		must(ch.Result(b))
		return 0
	case "proc":
		// Accepts, says where it stands, then waits for STOP and answers it.
		must(ch.Accept())
		must(ch.Progress(fmt.Appendf(nil, "ready env_fd_set=%t", os.Getenv(EnvFD) != "")))
		<-ch.Context().Done()
		cause := context.Cause(ch.Context())
		var se *StopError
		if !errors.As(cause, &se) {
			return fail(fmt.Errorf("stop cause %v, want a STOP", cause))
		}
		must(ch.Result([]byte("stopped: " + se.Class)))
		return 0
	case "group":
		// A grandchild in the same process group; both ignore SIGTERM and
		// the child ignores STOP: only SIGKILL to the group ends them.
		gc := exec.Command(exe, childArg, "grandchild")
		gc.Stdout = os.Stdout
		must(gc.Start())
		signal.Ignore(syscall.SIGTERM)
		must(ch.Accept())
		must(ch.Progress([]byte(strconv.Itoa(gc.Process.Pid))))
		hang()
	case "close-and-hang":
		// Accepts, closes its end and lives on, deaf to STOP and SIGTERM:
		// only the SIGKILL of the stop sequence ends it.
		signal.Ignore(syscall.SIGTERM)
		must(ch.Accept())
		ch.conn.Close()
		hang()
	case "stray-holder":
		// A descendant in a session of its own inherits the child's end,
		// then the child sends its RESULT and exits: the end stays open
		// after the exit, and no group kill reaches the holder.
		// A plain dup: conn.File would leave the shared description in
		// blocking mode, and the child's own reader stuck in read(2).
		rc, err := ch.conn.SyscallConn()
		must(err)
		dup := -1
		must(rc.Control(func(fd uintptr) { dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }))
		must(err)
		f := os.NewFile(uintptr(dup), "stray")
		gc := exec.Command(exe, childArg, "grandchild")
		gc.ExtraFiles = []*os.File{f}
		gc.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		must(gc.Start())
		f.Close()
		must(ch.Accept())
		must(ch.Progress([]byte(strconv.Itoa(gc.Process.Pid))))
		must(ch.Result([]byte("done")))
		return 0
	case "lease-echo":
		// Waits for one DEADLINE before it accepts, then reports every lease
		// it is given and why its Deadlines ended.
		<-ch.LeaseChanged()
		must(ch.Accept())
		l := ch.Lease()
		must(ch.Progress(fmt.Appendf(nil, "%d %d", l.Sent, l.Deadline)))
		for {
			select {
			case <-ch.LeaseChanged():
				l := ch.Lease()
				must(ch.Progress(fmt.Appendf(nil, "%d %d", l.Sent, l.Deadline)))
			case <-ch.Deadlines().Done():
				must(ch.Result([]byte(context.Cause(ch.Deadlines()).Error())))
				return 0
			}
		}
	case "reattach":
		// Accepts, reports progress, and when a new daemon's REATTACH moved
		// its lease, sends its RESULT: only a re-attached daemon gets it.
		must(ch.Accept())
		must(ch.Progress([]byte("before")))
		<-ch.LeaseChanged()
		must(ch.Result([]byte("after " + strconv.FormatBool(ch.Orphaned()))))
		return 0
	case "preaccept":
		// Says it is ready before it answers, waits for its parent to go,
		// then tries to accept, and says how that went.
		fmt.Printf("ready %d\n", os.Getpid())
		<-ch.Context().Done()
		if err := ch.Accept(); err != nil {
			fmt.Println("accept_refused")
			return 1
		}
		fmt.Println("accepted")
		return 0
	case "orphan":
		// Reports on stdout why its context ended; the test kills its parent.
		must(ch.Accept())
		<-ch.Context().Done()
		if errors.Is(context.Cause(ch.Context()), ErrParentGone) {
			fmt.Println("parent_gone")
		} else {
			fmt.Println("other:", context.Cause(ch.Context()))
		}
		return 0
	}
	return fail(fmt.Errorf("unknown mode"))
}

// middleMain is a daemon stand-in between the test and a turn child: it
// launches the child, prints "ready <pid>" on stdout (which the child shares)
// and waits for the test to kill it. In middle-reattach the child gets the
// re-attach socket named by envTestSocket and the lease of testLease.
func middleMain(exe, mode string) int {
	cfg := Config{Path: exe, Args: []string{childArg, "orphan"}, Stdout: os.Stdout, Stderr: os.Stderr}
	p := testPayload()
	if mode != "middle" {
		cfg.Args[1] = strings.TrimPrefix(mode, "middle-")
		cfg.Reattach = os.Getenv(envTestSocket)
		p.Lease = testLease(time.Hour)
	}
	t, err := Launch(context.Background(), cfg, p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "middle:", err)
		return 2
	}
	fmt.Printf("ready %d\n", t.PID())
	hang()
	return 0
}

// secret stands for the worker token inside the payload.
const secret = "wt-SECRET-9c1f4e"

func testPayload() Payload {
	return Payload{
		Echo: Echo{AttemptID: "att-42", LeaseGeneration: 7},
		Data: []byte(`{"job_id":"job-1","worker_token":"` + secret + `"}`),
	}
}

// envTestSocket names the re-attach socket for middle-reattach and
// listener-v2.
const envTestSocket = "HANDOVER_TEST_SOCKET"

// testLease is a lease sent now that ends ttl from now.
func testLease(ttl time.Duration) Lease {
	now := boottime.Now()
	return Lease{Sent: now, Deadline: now.Add(ttl)}
}

// listenerV2 stands for a child of a release whose protocol this one does
// not speak: it listens on envTestSocket and answers any REATTACH with an
// ATTACHED of version 2, then waits to be killed.
func listenerV2() int {
	signal.Ignore(syscall.SIGTERM) // only the SIGKILL KillGrace later ends it
	path := os.Getenv(envTestSocket)
	f, err := bindReattach(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lis, err := listenOn(int(f.Fd()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready", os.Getpid())
	conn, err := lis.AcceptUnix()
	if err != nil {
		return 2
	}
	f2, err := readFrame(conn, newReadBuffer())
	if err != nil || f2.Type != FrameReattach {
		return 2
	}
	r, _ := parseReattach(f2.Body)
	body, _ := encodeAttached(attached{Echo: r.Echo, Version: 2})
	_ = writeFrame(conn, FrameAttached, body)
	hang()
	return 0
}

// reattachEMFILE is a stand-in daemon whose descriptors run out: it lowers
// its own RLIMIT_NOFILE (the test process keeps its own), fills every
// descriptor up to it, and re-attaches to the child waiting on
// envTestSocket with 0, 1, 2, … descriptors left, printing one line per
// try ("no_child", "unattached <pid> alive=<bool>", "other"), until a try
// re-attaches: then "reattached", and the turn's end as "end <outcome>
// <result>".
func reattachEMFILE() int {
	lim := unix.Rlimit{Cur: 256, Max: 256}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lim.Max = old.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var fill []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break // EMFILE: every descriptor is taken
		}
		fill = append(fill, f)
	}
	cfg := Config{Reattach: os.Getenv(envTestSocket), StopGrace: 30 * time.Second, KillGrace: 30 * time.Second, ExecutionTimeout: 2 * time.Minute}
	for free := 0; free <= 8 && free < len(fill); free++ {
		// free descriptors left for the try; the runtime's own are open already.
		for _, f := range fill[len(fill)-free:] {
			f.Close()
		}
		turn, err := Reattach(context.Background(), cfg, testPayload().Echo, testLease(time.Hour))
		var ua *Unattached
		switch {
		case err == nil:
			fmt.Println("reattached")
			end := turn.Wait()
			fmt.Printf("end %s %s\n", end.Outcome, end.Result)
			return 0
		case errors.Is(err, ErrNoChild):
			fmt.Println("no_child")
		case errors.As(err, &ua):
			fmt.Printf("unattached %d alive=%t\n", ua.PID, ua.Alive())
		default:
			fmt.Println("other", err)
		}
		// Take the descriptors back for the next round.
		fill = fill[:len(fill)-free]
		for range free {
			f, err := os.Open(os.DevNull)
			if err != nil {
				break
			}
			fill = append(fill, f)
		}
	}
	fmt.Println("never_reattached")
	return 1
}
