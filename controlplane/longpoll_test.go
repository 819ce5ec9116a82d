package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/wire"
)

// bubble is a server, exactly as another package's test builds it
// (controlplane.New with a store and nothing else but a quiet logger), on
// a real SQLite store, served over an in-memory network inside a synctest
// bubble: the long polls and the reaper run on fake time.
type bubble struct {
	st        store.Store
	srv       *controlplane.Server
	wc        *wire.Client
	hostToken string
	userToken string
}

func newBubble(t *testing.T, opts ...sqlstore.Option) *bubble {
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"), opts...)
	if err != nil {
		t.Fatalf("open sqlite store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
	l := memnet.Listen("cp.test")
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	tr := &http.Transport{DialContext: l.Dial}
	t.Cleanup(tr.CloseIdleConnections)
	b := &bubble{st: st, srv: srv, wc: &wire.Client{BaseURL: "http://cp.test", HTTP: &http.Client{Transport: tr}}}
	b.hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := st.CreateHost(context.Background(), "host-a", controlplane.HashToken(b.hostToken), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	b.userToken = controlplane.NewToken(controlplane.UserTokenPrefix)
	if _, err := st.CreateUserToken(context.Background(), "test", controlplane.HashToken(b.userToken), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	return b
}

// enqueue puts a turn of a new conversation in the queue.
func (b *bubble) enqueue(t *testing.T) wire.Job {
	t.Helper()
	j, err := b.tryEnqueue()
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (b *bubble) tryEnqueue() (wire.Job, error) {
	ctx := context.Background()
	c, err := b.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "i", AgentCommand: []string{"a"}}, time.Now())
	if err != nil {
		return wire.Job{}, err
	}
	return b.st.EnqueueTurn(ctx, c.ID, "hello", time.Now())
}

// The claim long poll holds an empty queue for wait_ms, capped at
// ClaimWaitMax, answers 204 then, and hands out a turn enqueued meanwhile
// within one poll step.
func TestClaimLongPoll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		waitMS  int64
		enqueue time.Duration // 0: never
		want    time.Duration
		claimed bool
	}{
		{"no wait", 0, 0, 0, false},
		{"empty queue for 10s", 10_000, 0, 10 * time.Second, false},
		{"capped at ClaimWaitMax", 600_000, 0, controlplane.DefaultClaimWaitMax, false},
		{"turn arrives after 7s", 30_000, 7 * time.Second, 7*time.Second + 250*time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBubble(t)
				if tc.enqueue > 0 {
					go func() {
						time.Sleep(tc.enqueue)
						if _, err := b.tryEnqueue(); err != nil {
							t.Error(err)
						}
					}()
				}
				start := time.Now()
				c, err := b.wc.Claim(context.Background(), b.hostToken, wire.ClaimRequest{WaitMS: tc.waitMS})
				took := time.Since(start)
				if tc.claimed {
					if err != nil || c.JobID == "" {
						t.Fatalf("claim: %+v, %v", c, err)
					}
					if took < tc.enqueue || took > tc.want {
						t.Fatalf("claimed after %v, want between %v and %v", took, tc.enqueue, tc.want)
					}
					return
				}
				if !errors.Is(err, wire.ErrNoClaim) {
					t.Fatalf("claim: %+v, %v; want 204", c, err)
				}
				if took != tc.want {
					t.Fatalf("204 after %v, want exactly %v", took, tc.want)
				}
			})
		})
	}
}

// A long poll whose caller gives up returns at once and leaves nothing
// running (the bubble would report a leaked goroutine).
func TestClaimLongPollEndsWithTheCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := b.wc.Claim(ctx, b.hostToken, wire.ClaimRequest{WaitMS: 30_000})
		if wire.Classify(err) != wire.Transient || time.Since(start) != 3*time.Second {
			t.Fatalf("claim with a 3s deadline: %v after %v", err, time.Since(start))
		}
		// The server noticed: a turn enqueued now goes to the next claim.
		j := b.enqueue(t)
		synctest.Wait()
		c, err := b.wc.Claim(context.Background(), b.hostToken, wire.ClaimRequest{})
		if err != nil || c.JobID != j.ID || c.LeaseGeneration != 1 {
			t.Fatalf("claim after an abandoned long poll: %+v, %v", c, err)
		}
	})
}

// Following a job's events waits for the next one and ends with the job.
func TestFollowEventsLongPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		j := b.enqueue(t)
		ctx := context.Background()
		c, err := b.wc.Claim(ctx, b.hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var page wire.JobEventList
		if _, err := b.wc.Do(ctx, "GET", "/v1/jobs/"+j.ID+"/events", b.userToken, nil, &page); err != nil || len(page.Events) == 0 {
			t.Fatalf("first page: %+v, %v", page, err)
		}
		cursor := page.Events[len(page.Events)-1].ID

		go func() {
			time.Sleep(20 * time.Second)
			b.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "x"})
		}()
		start := time.Now()
		path := fmt.Sprintf("/v1/jobs/%s/events?after=%d&wait_ms=25000", j.ID, cursor)
		if _, err := b.wc.Do(ctx, "GET", path, b.userToken, nil, &page); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		if len(page.Events) == 0 || took < 20*time.Second || took > 20*time.Second+250*time.Millisecond {
			t.Fatalf("follow answered after %v with %+v; want the finish's events at 20s", took, page)
		}
		// Past the last event of an ended job: ended, at once.
		cursor = page.Events[len(page.Events)-1].ID
		start = time.Now()
		path = fmt.Sprintf("/v1/jobs/%s/events?after=%d&wait_ms=25000", j.ID, cursor)
		if _, err := b.wc.Do(ctx, "GET", path, b.userToken, nil, &page); err != nil || !page.Ended || len(page.Events) != 0 || time.Since(start) != 0 {
			t.Fatalf("follow past the end: %+v, %v after %v", page, err, time.Since(start))
		}
	})
}

// RunReaper supersedes an attempt whose lease expired more than the grace
// ago and requeues the never-admitted job; cancelling its context ends it.
func TestRunReaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		j := b.enqueue(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- b.srv.RunReaper(ctx) }()

		c, err := b.wc.Claim(context.Background(), b.hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// Just inside expiry plus grace, the attempt still stands.
		time.Sleep(controlplane.DefaultLeaseTTL + controlplane.DefaultReaperGrace - time.Second)
		synctest.Wait()
		if got, _ := b.st.GetJob(context.Background(), j.ID); got.Attempts[0].State != wire.AttemptRunning {
			t.Fatalf("attempt %q before expiry plus grace, want running", got.Attempts[0].State)
		}
		time.Sleep(controlplane.DefaultReaperInterval + time.Second)
		synctest.Wait()
		got, _ := b.st.GetJob(context.Background(), j.ID)
		if got.State != wire.JobQueued || got.Attempts[0].State == wire.AttemptRunning || !hasEvent(got, "attempt_superseded") {
			t.Fatalf("after expiry plus grace: job %q, attempt %q, events %+v", got.State, got.Attempts[0].State, got.Events)
		}
		if _, err := b.wc.Renew(context.Background(), c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); wire.Classify(err) != wire.Definitive {
			t.Fatalf("renew of the superseded attempt: %v, want 409", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("RunReaper: %v", err)
		}
	})
}

// The control plane's own absence is not the workers' silence: after ten
// minutes away, a lease that expired meanwhile gets a full TTL from the
// return and still renews (P4).
func TestReaperAfterAbsenceGivesFullLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		b.enqueue(t)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- b.srv.RunReaper(ctx) }()
		c, err := b.wc.Claim(context.Background(), b.hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		cancel()
		<-done

		time.Sleep(10 * time.Minute) // the control plane is away

		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		go func() { done <- b.srv.RunReaper(ctx) }()
		synctest.Wait()
		time.Sleep(controlplane.DefaultLeaseTTL - time.Second)
		synctest.Wait()
		rn, err := b.wc.Renew(context.Background(), c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)})
		if err != nil {
			t.Fatalf("renew after the control plane's absence: %v", err)
		}
		if !rn.LeaseExpiresAt.Equal(time.Now().Add(controlplane.DefaultLeaseTTL)) {
			t.Fatalf("renewed until %v, want a full lease from now", rn.LeaseExpiresAt)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// K10: the host's cancel poll is held while none of the running attempts
// it names has its cancel requested (204 after wait_ms), answers within
// one poll step of the user's cancel with exactly that attempt, never
// names another host's attempt, and refuses a request that names none.
func TestCancelsLongPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubble(t)
		ctx := context.Background()
		b.enqueue(t)
		b.enqueue(t)
		c1, err := b.wc.Claim(ctx, b.hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		c2, err := b.wc.Claim(ctx, b.hostToken, wire.ClaimRequest{})
		if err != nil {
			t.Fatal(err)
		}
		watch := wire.CancelsRequest{AttemptIDs: []string{c1.AttemptID, c2.AttemptID}, WaitMS: 20_000}
		start := time.Now()
		if ids, err := b.wc.Cancels(ctx, b.hostToken, watch); err != nil || len(ids) != 0 || time.Since(start) != 20*time.Second {
			t.Fatalf("cancel poll with no cancel: %v, %v after %v; want 204 after 20s", ids, err, time.Since(start))
		}
		const cancelAfter = 7 * time.Second
		go func() {
			time.Sleep(cancelAfter)
			if _, err := b.st.CancelJob(ctx, c2.JobID, time.Now()); err != nil {
				t.Error(err)
			}
		}()
		start = time.Now()
		ids, err := b.wc.Cancels(ctx, b.hostToken, watch)
		took := time.Since(start)
		if err != nil || len(ids) != 1 || ids[0] != c2.AttemptID {
			t.Fatalf("cancel poll: %v, %v; want [%s]", ids, err, c2.AttemptID)
		}
		if took < cancelAfter || took > cancelAfter+250*time.Millisecond {
			t.Fatalf("the cancel came %v after the poll began, the user's %v", took, cancelAfter)
		}
		// Another host knows nothing of these attempts.
		other := controlplane.NewToken(controlplane.HostTokenPrefix)
		if _, err := b.st.CreateHost(ctx, "host-b", controlplane.HashToken(other), store.Audit{Actor: "test"}, time.Now()); err != nil {
			t.Fatal(err)
		}
		if ids, err := b.wc.Cancels(ctx, other, wire.CancelsRequest{AttemptIDs: []string{c2.AttemptID}}); err != nil || len(ids) != 0 {
			t.Fatalf("another host's cancel poll: %v, %v; want nothing", ids, err)
		}
		if _, err := b.wc.Cancels(ctx, b.hostToken, wire.CancelsRequest{}); !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("a cancel poll naming no attempt: %v, want 400", err)
		}
	})
}

func isStatus(err error, status int) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Status == status
}
