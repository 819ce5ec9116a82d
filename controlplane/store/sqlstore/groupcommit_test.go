package sqlstore_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
	"github.com/runnerd/runnerd/wire"
)

// K9: SQLite commits durably unless told otherwise, and NORMAL is a
// choice the caller spells out.
func TestK9SQLiteSynchronousFullByDefault(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []sqlstore.Option
		want sqlstore.Synchronous
	}{
		{"default", nil, sqlstore.SyncFull},
		{"full", []sqlstore.Option{sqlstore.WithSynchronous(sqlstore.SyncFull)}, sqlstore.SyncFull},
		{"normal by choice", []sqlstore.Option{sqlstore.WithSynchronous(sqlstore.SyncNormal)}, sqlstore.SyncNormal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := sqlstore.OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			got, err := st.WriterSynchronous(ctx)
			if err != nil || got != tc.want {
				t.Fatalf("PRAGMA synchronous = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// batchFixture is a SQLite store inside a synctest bubble with one host
// and one running attempt to renew.
type batchFixture struct {
	st   *sqlstore.Store
	host store.Host
	run  wire.Claim
	now  time.Time
}

func newBatchFixture(t *testing.T, dir string, queued int) *batchFixture {
	t.Helper()
	ctx := context.Background()
	st, err := sqlstore.OpenSQLite(ctx, filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &batchFixture{st: st, now: time.Now()}
	if f.host, err = st.CreateHost(ctx, "host-a", storetest.Hash("host-a"), store.Audit{Actor: "test"}, f.now); err != nil {
		t.Fatal(err)
	}
	for range queued + 1 {
		conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, f.now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.EnqueueTurn(ctx, conv.ID, "p", f.now); err != nil {
			t.Fatal(err)
		}
	}
	c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: f.host.ID, WorkerTokenHash: storetest.Hash("w0"), Now: f.now})
	if err != nil || !ok {
		t.Fatalf("Claim = %v, %v", ok, err)
	}
	f.run = c
	return f
}

// batch queues every write behind the held writer, waits until each is
// blocked, lets the writer go and returns each write's answer, in order,
// with the number of commits they took.
func (f *batchFixture) batch(t *testing.T, writes ...func(ctx context.Context) error) ([]error, int64) {
	t.Helper()
	release := sqlstore.HoldWriter(f.st)
	before := sqlstore.Commits(f.st)
	errs := make([]error, len(writes))
	early := make([]bool, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() {
			errs[i] = w(context.Background())
			early[i] = sqlstore.Commits(f.st) == before
		})
	}
	synctest.Wait() // every write is queued behind the writer
	release()
	wg.Wait()
	for i := range early {
		if early[i] {
			t.Errorf("write %d was answered before its batch committed", i)
		}
	}
	return errs, sqlstore.Commits(f.st) - before
}

func (f *batchFixture) renew(ctx context.Context) error {
	_, err := f.st.Renew(ctx, wire.AttemptRef{AttemptID: f.run.AttemptID, LeaseGeneration: f.run.LeaseGeneration}, time.Minute, f.now)
	return err
}

// K9 with throughput: every write queued behind the writer commits in one
// transaction, and each caller has its own answer.
func TestK9GroupCommitOneTransactionPerBatch(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		f := newBatchFixture(t, dir, 3)
		ctx := context.Background()
		writes := []func(context.Context) error{f.renew, f.renew, f.renew, f.renew, f.renew}
		claimed := make([]wire.Claim, 3)
		for i := range claimed {
			writes = append(writes, func(ctx context.Context) error {
				c, ok, err := f.st.Claim(ctx, store.ClaimParams{HostID: f.host.ID,
					WorkerTokenHash: storetest.Hash("w" + string(rune('a'+i))), Now: f.now})
				if err == nil && !ok {
					err = errors.New("nothing claimed")
				}
				claimed[i] = c
				return err
			})
		}
		before := f.st.GroupCommits()
		errs, commits := f.batch(t, writes...)
		for i, err := range errs {
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}
		if commits != 1 {
			t.Fatalf("%d writes queued together took %d commits, want 1", len(writes), commits)
		}
		if after := f.st.GroupCommits(); after.Commits-before.Commits != 1 || after.Writes-before.Writes != int64(len(writes)) {
			t.Fatalf("GroupCommits counted %d commits of %d writes, want 1 of %d", after.Commits-before.Commits, after.Writes-before.Writes, len(writes))
		}
		jobs := map[string]bool{}
		for _, c := range claimed {
			jobs[c.JobID] = true
			j, err := f.st.GetJob(ctx, c.JobID)
			if err != nil || j.State != wire.JobRunning || len(j.Attempts) != 1 || j.Attempts[0].ID != c.AttemptID {
				t.Fatalf("job %s after the batch: %+v, %v", c.JobID, j, err)
			}
		}
		if len(jobs) != 3 || jobs[f.run.JobID] {
			t.Fatalf("the three claims of one batch took jobs %v (the running one is %s)", jobs, f.run.JobID)
		}
		// Alone, a write is its own batch.
		errs, commits = f.batch(t, f.renew)
		if errs[0] != nil || commits != 1 {
			t.Fatalf("a lone renewal: %v, %d commits", errs[0], commits)
		}
	})
}

// One failing write in a batch fails alone: its own statements are rolled
// back (a claim for an unknown host has already taken a job when its
// attempt cannot be inserted), its neighbours commit, with the batch's
// one commit.
func TestK9GroupCommitFailingWriteSparesNeighbours(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		f := newBatchFixture(t, dir, 2)
		ctx := context.Background()
		var good wire.Claim
		errs, commits := f.batch(t,
			f.renew,
			func(ctx context.Context) error {
				_, _, err := f.st.Claim(ctx, store.ClaimParams{HostID: "host_nope", WorkerTokenHash: storetest.Hash("bad"), Now: f.now})
				return err
			},
			f.renew,
			func(ctx context.Context) error {
				_, err := f.st.CreateHost(ctx, "host-a", storetest.Hash("again"), store.Audit{Actor: "test"}, f.now)
				return err
			},
			func(ctx context.Context) error {
				c, ok, err := f.st.Claim(ctx, store.ClaimParams{HostID: f.host.ID, WorkerTokenHash: storetest.Hash("good"), Now: f.now})
				if err == nil && !ok {
					err = errors.New("nothing claimed")
				}
				good = c
				return err
			},
			f.renew,
		)
		if commits != 1 {
			t.Fatalf("the batch took %d commits, want 1", commits)
		}
		for _, i := range []int{0, 2, 4, 5} {
			if errs[i] != nil {
				t.Errorf("write %d failed beside a failing neighbour: %v", i, errs[i])
			}
		}
		if !errors.Is(errs[1], store.ErrNotFound) {
			t.Errorf("claim for an unknown host: %v, want ErrNotFound", errs[1])
		}
		if !errors.Is(errs[3], store.ErrExists) {
			t.Errorf("second host of the same name: %v, want ErrExists", errs[3])
		}
		// The failed claim's job was given back whole: one job still
		// queued, never claimed, no attempt, no event of a claim.
		servers, err := f.st.ListServers(ctx)
		if err != nil || len(servers) != 1 || servers[0].Running != 2 {
			t.Fatalf("servers after the batch: %+v, %v (want one host running 2)", servers, err)
		}
		c, ok, err := f.st.Claim(ctx, store.ClaimParams{HostID: f.host.ID, WorkerTokenHash: storetest.Hash("last"), Now: f.now})
		if err != nil || !ok {
			t.Fatalf("the job the failed claim touched is not claimable: %v, %v", ok, err)
		}
		if c.LeaseGeneration != 1 || c.JobID == good.JobID || c.JobID == f.run.JobID {
			t.Fatalf("last claim %+v: want the untouched job at generation 1", c)
		}
		j, err := f.st.GetJob(ctx, c.JobID)
		if err != nil || j.AttemptCount != 1 || len(j.Attempts) != 1 {
			t.Fatalf("job %s: %d attempts, count %d, %v; want the one just claimed", c.JobID, len(j.Attempts), j.AttemptCount, err)
		}
		claims := 0
		for _, e := range j.Events {
			if e.Type == "claimed" {
				claims++
			}
		}
		if claims != 1 {
			t.Fatalf("job %s has %d claimed events, want 1: the failed claim left one", c.JobID, claims)
		}
	})
}

// A write whose caller gives up while it waits for the writer is taken
// off the queue and never runs; the writes queued beside it still commit.
func TestGroupCommitWithdrawnWriteNeverRuns(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		f := newBatchFixture(t, dir, 0)
		release := sqlstore.HoldWriter(f.st)
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() {
			_, err := f.st.CreateHost(ctx, "host-withdrawn", storetest.Hash("withdrawn"), store.Audit{Actor: "test"}, f.now)
			gaveUp <- err
		}()
		kept := make(chan error, 1)
		go func() {
			_, err := f.st.CreateHost(context.Background(), "host-kept", storetest.Hash("kept"), store.Audit{Actor: "test"}, f.now)
			kept <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("a write given up in the queue: %v, want context.Canceled", err)
		}
		release()
		if err := <-kept; err != nil {
			t.Fatalf("the write queued beside it: %v", err)
		}
		servers, err := f.st.ListServers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range servers {
			names = append(names, s.Name)
		}
		if len(names) != 2 || names[0] != "host-a" || names[1] != "host-kept" {
			t.Fatalf("hosts %v: the withdrawn write ran, or the kept one did not", names)
		}
	})
}

// The work signal is specific: on SQLite it fires, before
// the write that made work returns, for an enqueue, and not for writes
// that make nothing claimable — a claim, a renewal, a heartbeat with the
// labels of the one before — so waiting long polls are not woken by every
// commit.
func TestWorkSignalOnlyForNewWork(t *testing.T) {
	ctx := context.Background()
	st := sqltest.SQLite(t)
	now := time.Now()
	h, err := st.CreateHost(ctx, "host-a", storetest.Hash("h"), store.Audit{Actor: "test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	beat := wire.HostHeartbeat{Capacity: 1, Labels: wire.Labels{"os": "linux"}}
	if err := st.RecordHostHeartbeat(ctx, h.ID, beat, now); err != nil {
		t.Fatal(err)
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"a"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	ch := st.WorkSignal()
	if _, err := st.EnqueueTurn(ctx, conv.ID, "p", now); err != nil {
		t.Fatal(err)
	}
	if !closed(ch) {
		t.Fatal("no signal when the enqueue returned")
	}
	ch = st.WorkSignal()
	c, ok, err := st.Claim(ctx, store.ClaimParams{HostID: h.ID, WorkerTokenHash: storetest.Hash("w"), Now: now})
	if err != nil || !ok {
		t.Fatalf("Claim = %v, %v", ok, err)
	}
	if _, err := st.Renew(ctx, wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}, time.Minute, now); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordHostHeartbeat(ctx, h.ID, beat, now); err != nil {
		t.Fatal(err)
	}
	if closed(ch) {
		t.Fatal("a claim, a renewal or a heartbeat with unchanged labels signalled new work")
	}
}
