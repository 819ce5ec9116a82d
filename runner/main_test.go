package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/supervisor"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// TestMain re-enters the test binary as the turn child when the daemon
// starts it with "turn" (style 8), as the real sandbox manager for the
// process backend with "supervise", and checks for leaked goroutines.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "turn" {
		os.Exit(fakeTurn())
	}
	if len(os.Args) > 2 && os.Args[1] == "old-daemon" {
		os.Exit(oldDaemon(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == "supervise" {
		os.Exit(supervise(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

func supervise(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return supervisor.Main(ctx, args, os.Stderr)
}

// fakeTurn is a scripted turn child: a real process on the real handover
// descriptor. The prompt is the script:
//
//	decline   DECLINE preflight_failed (the claim is released)
//	close     close the descriptor without a word (a decline too)
//	result    ACCEPT, PROGRESS, RESULT failed/scripted, exit 0
//	exit      ACCEPT, PROGRESS (container recorded), exit 3 without RESULT
//	hang      ACCEPT, then wait for STOP (or the parent's end); exit 0 without RESULT
//	stopped   ACCEPT, wait for STOP, then RESULT: cancelled for a STOP of class
//	          "cancelled", failed with the STOP's class otherwise
//	silent    never answer; wait for STOP
//	die       read the payload, then die by SIGKILL before any answer
//	rejected  ACCEPT, PROGRESS (container recorded), RESULT failed with
//	          LeaseRejected, as when the child's own write got a 409
//	deaf      ACCEPT, PROGRESS, then ignore STOP, SIGTERM and its own
//	          deadlines: only SIGKILL ends it
//	reattach  ACCEPT, PROGRESS, wait until a lease moves (a new daemon's
//	          REATTACH: the old one sends none), RESULT failed/scripted
func fakeTurn() int {
	ch, err := handover.OpenFromEnv()
	if err != nil {
		return 90
	}
	defer ch.Close()
	var p turn.Payload
	if err := json.Unmarshal(ch.Payload().Data, &p); err != nil || p.Claim.WorkerToken == "" || p.ControlPlaneURL == "" {
		_ = ch.Decline("bad_payload")
		return 91
	}
	for _, v := range []string{"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", handover.EnvFD} {
		if _, ok := os.LookupEnv(v); ok {
			_ = ch.Decline("env_leak") // systemd's variables are the daemon's alone
			return 94
		}
	}
	ref := wire.AttemptRef{AttemptID: p.Claim.AttemptID, LeaseGeneration: p.Claim.LeaseGeneration}
	switch p.Claim.Turn.Prompt {
	case "decline":
		_ = ch.Decline("preflight_failed")
		return 0
	case "decline agent missing": // the conversation's own fault (S4)
		_ = ch.Decline(sandbox.ClassAgentMissing)
		return 0
	case "close":
		return 0
	case "silent":
		<-ch.Context().Done()
		return 0
	case "die":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	if err := ch.Accept(); err != nil {
		return 92
	}
	progress := func(f settlement.Facts) {
		b, _ := json.Marshal(turn.Progress{Stage: "test", Facts: f, At: time.Now()})
		_ = ch.Progress(b)
	}
	switch p.Claim.Turn.Prompt {
	case "result":
		progress(settlement.Facts{})
		rep := settlement.Facts{}.Report(ref, settlement.Result{Outcome: wire.OutcomeFailed, Class: "scripted"})
		b, _ := json.Marshal(turn.Result{Report: rep, Outcome: wire.OutcomeFailed, Class: "scripted"})
		_ = ch.Result(b)
		return 0
	case "exit":
		progress(settlement.Facts{ContainerRecorded: true})
		return 3
	case "rejected":
		f := settlement.Facts{ContainerRecorded: true}
		progress(f)
		rep := f.Report(ref, settlement.Result{Outcome: wire.OutcomeFailed, Class: turn.ClassAdmissionRefused})
		b, _ := json.Marshal(turn.Result{Report: rep, Outcome: wire.OutcomeFailed, Class: turn.ClassAdmissionRefused, LeaseRejected: true})
		_ = ch.Result(b)
		return 0
	case "hang":
		progress(settlement.Facts{})
		<-ch.Context().Done()
		return 0
	case "deaf":
		signal.Ignore(syscall.SIGTERM)
		progress(settlement.Facts{})
		for {
			time.Sleep(time.Hour)
		}
	case "reattach":
		progress(settlement.Facts{})
		<-ch.LeaseChanged()
		rep := settlement.Facts{}.Report(ref, settlement.Result{Outcome: wire.OutcomeFailed, Class: "scripted"})
		b, _ := json.Marshal(turn.Result{Report: rep, Outcome: wire.OutcomeFailed, Class: "scripted"})
		_ = ch.Result(b)
		return 0
	case "stopped":
		<-ch.Context().Done()
		var se *handover.StopError
		if !errors.As(context.Cause(ch.Context()), &se) {
			return 95
		}
		outcome := wire.OutcomeFailed
		if se.Class == turn.ClassCancelled {
			outcome = wire.OutcomeCancelled
		}
		rep := settlement.Facts{}.Report(ref, settlement.Result{Outcome: outcome, Class: se.Class})
		b, _ := json.Marshal(turn.Result{Report: rep, Outcome: outcome, Class: se.Class})
		_ = ch.Result(b)
		return 0
	}
	return 93
}

// oldDaemonSpec is what oldDaemon launches: a turn child with the
// attempt's re-attach socket and its payload (which holds the worker
// token: the file is 0600).
type oldDaemonSpec struct {
	Socket string        `json:"socket"`
	Echo   handover.Echo `json:"echo"`
	Data   []byte        `json:"data"`
}

// oldDaemon stands for an earlier run of the daemon: it launches the turn
// child of the spec at path ("turn", fakeTurn) with the attempt's re-attach
// socket and an hour's lease, prints "ready <pid>" once the child accepted
// and waits for the test to kill it (SIGKILL), which orphans the child.
func oldDaemon(path string) int {
	b, err := os.ReadFile(path)
	var spec oldDaemonSpec
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	exe, xerr := os.Executable()
	if err = errors.Join(err, xerr); err != nil {
		fmt.Fprintln(os.Stderr, "old daemon:", err)
		return 2
	}
	now := boottime.Now()
	t, err := handover.Launch(context.Background(),
		handover.Config{Path: exe, Args: []string{"turn"}, Stderr: os.Stderr, Reattach: spec.Socket},
		handover.Payload{Echo: spec.Echo, Lease: handover.Lease{Sent: now, Deadline: now.Add(time.Hour)}, ExecDeadline: now.Add(time.Hour), Data: spec.Data})
	if err != nil {
		fmt.Fprintln(os.Stderr, "old daemon:", err)
		return 2
	}
	fmt.Printf("ready %d\n", t.PID())
	for {
		time.Sleep(time.Hour)
	}
}
