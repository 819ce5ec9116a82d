package main

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/wire"
)

// K3, P4 with the real command and the real database clock: `controlplane
// serve` stopped with SIGSTOP for longer than a lease and than the absence
// gap, with renewals queued against it. On SIGCONT the renewals, its
// reaper's overdue tick and the HTTP server all run at once, and every
// renewal is accepted: none is refused for the expiry that fell inside the
// pause, none answered 503. The pause itself is real time (12 s): it is the
// thing under test, not a wait for something. Which runs first after
// SIGCONT is the scheduler's choice, and the overdue tick often wins, so
// this end-to-end check also passed before the guard decided absence; the
// orderings are pinned down by controlplane.TestK3RenewalsAcrossPauseAndRestartAccepted
// and the store's K3 conformance subtests.
func TestK3PausedServeAcceptsQueuedRenewals(t *testing.T) {
	if testing.Short() {
		t.Skip("a 12 s pause of a real process")
	}
	bin := filepath.Join(t.TempDir(), "controlplane")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			dir := t.TempDir()
			dbArgs := []string{"--data-dir", dir}
			if db == "postgres" {
				dbArgs = append(dbArgs, "--db", sqltest.PostgresSchema(t))
			}
			cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--min-lease-ttl", "2s",
				"--reaper-interval", "1s", "--reaper-grace", "1s"}, dbArgs...)...)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(stderr)
			if !sc.Scan() {
				t.Fatalf("serve printed nothing: %v", sc.Err())
			}
			_, addr, ok := strings.Cut(sc.Text(), "serving ")
			if !ok {
				t.Fatalf("first line %q does not name the address", sc.Text())
			}
			addr, _, _ = strings.Cut(addr, " ")
			go func() {
				for sc.Scan() {
				}
			}()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGCONT)
				_ = cmd.Process.Signal(syscall.SIGTERM)
				_ = cmd.Wait()
			}()
			code, stdout, errOut := runCmd(t, noEnv, append([]string{"host", "add", "host-1"}, dbArgs...)...)
			if code != exitOK {
				t.Fatalf("host add: %d %s", code, errOut)
			}
			hostToken := strings.TrimSpace(stdout)
			tok, err := os.ReadFile(filepath.Join(dir, "user-token"))
			if err != nil {
				t.Fatal(err)
			}
			userToken := strings.TrimSpace(string(tok))
			ctx := context.Background()
			wc := &wire.Client{BaseURL: addr, HTTP: &http.Client{Timeout: time.Minute}}
			const ttl = 2 * time.Second
			var claims []wire.Claim
			for i := 0; i < 4; i++ {
				var conv wire.Conversation
				if _, err := wc.Do(ctx, "POST", "/v1/conversations", userToken,
					wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, &conv); err != nil {
					t.Fatal(err)
				}
				if _, err := wc.Do(ctx, "POST", "/v1/conversations/"+conv.ID+"/messages", userToken,
					wire.SendMessageRequest{Prompt: "hello"}, nil); err != nil {
					t.Fatal(err)
				}
				c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{LeaseTTLMS: ttl.Milliseconds()})
				if err != nil {
					t.Fatal(err)
				}
				claims = append(claims, c)
			}
			if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 3*len(claims))
			for _, c := range claims {
				for k := 0; k < 3; k++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req := wire.RenewRequest{AttemptRef: wire.AttemptRef{
							AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}, LeaseTTLMS: ttl.Milliseconds()}
						_, err := wc.Renew(ctx, c.WorkerToken, c.JobID, req)
						var se *wire.StatusError
						if err != nil && !errors.As(err, &se) {
							// A connection that did not survive the pause (seen
							// once: a reset) is no answer, and a runner tries
							// again (R4); only an answer can refuse the lease.
							_, err = wc.Renew(ctx, c.WorkerToken, c.JobID, req)
						}
						errs <- err
					}()
				}
			}
			time.Sleep(12 * time.Second) // the pause: > lease + grace, > the 10 s absence gap
			if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("a renewal queued against the paused control plane: %v", err)
				}
			}
			for _, c := range claims {
				var j wire.Job
				if _, err := wc.Do(ctx, "GET", "/v1/jobs/"+c.JobID, userToken, nil, &j); err != nil {
					t.Fatal(err)
				}
				if j.State != wire.JobRunning || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptRunning {
					t.Fatalf("job after the pause = %s with attempts %+v", j.State, j.Attempts)
				}
			}
		})
	}
}
