package turn

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/runnerd/runnerd/handover"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/sandbox/supervisor"
)

// startSupervisor serves a real supervisor in this process.
func startSupervisor(t *testing.T) *sandbox.Client {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- supervisor.Serve(ctx, supervisor.Config{Socket: sock, Workspace: filepath.Join(dir, "ws"), Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return &sandbox.Client{Socket: sock}
}

// hangingAgent is an agent that writes one event and never ends.
var hangingAgent = []string{"/bin/sh", "-c", `echo '{"type":"turn.started"}'; exec sleep 400`}

// K10 (child part): the user's cancel, and only it, asks the supervisor to
// interrupt; a receipt makes wait report true. A supervisor that cannot
// interrupt (here one that never answers) makes the child drop the driving
// connection instead — the agent is stopped with no receipt, and the turn
// fails closed.
func TestInterruptOnlyOnTheUserCancel(t *testing.T) {
	tr := &turn{log: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		name        string
		cause       error
		unreachable bool
		wantOK      bool
		wantDrop    bool
	}{
		{"user cancel", &handover.StopError{Class: ClassCancelled}, false, true, false},
		{"lease lost", &handover.StopError{Class: StopLeaseLost}, false, false, false},
		{"supervisor does not answer", &handover.StopError{Class: ClassCancelled}, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startSupervisor(t)
			bg := context.Background()
			act, err := cl.Activate(bg, 0)
			if err != nil {
				t.Fatal(err)
			}
			st, err := cl.Run(bg, act.ID, hangingAgent, "")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, err := st.Next(); err != nil {
				t.Fatal(err)
			}
			icl := cl
			if tc.unreachable {
				// A socket that takes the request and never answers.
				sock := filepath.Join(t.TempDir(), "mute.sock")
				l, err := net.Listen("unix", sock)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				go func() {
					for {
						c, err := l.Accept()
						if err != nil {
							return
						}
						defer c.Close()
					}
				}()
				icl = &sandbox.Client{Socket: sock}
			}
			ctx, cancel := context.WithCancelCause(bg)
			runCtx, endRun := context.WithCancel(bg)
			defer endRun()
			dropped := make(chan struct{})
			in := tr.interruptOnCancel(ctx, runCtx, icl, act.ID, func() { close(dropped) })
			start := time.Now()
			cancel(tc.cause)
			if ok := in.wait(); ok != tc.wantOK {
				t.Fatalf("wait = %v, want %v", ok, tc.wantOK)
			}
			select {
			case <-dropped:
				if !tc.wantDrop {
					t.Fatal("the driving connection was dropped")
				}
				if took := time.Since(start); took < InterruptGrace {
					t.Fatalf("dropped after %v, before the interrupt's grace and call time ran out", took)
				}
			default:
				if tc.wantDrop {
					t.Fatal("a failed interrupt did not drop the driving connection")
				}
			}
			r, err := cl.Settle(bg, act.ID)
			switch {
			case tc.wantOK:
				if err != nil || !r.Interrupted {
					t.Fatalf("settle after the interrupt: %+v, %v", r, err)
				}
			default:
				if !errors.Is(err, sandbox.ErrBusy) {
					t.Fatalf("settle without an interrupt: %+v, %v; want the turn still running", r, err)
				}
			}
		})
	}
}
