package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// B2: claim → finish over HTTP as a fleet makes it: b.o.hosts simulated
// hosts, each with its own host token and b.o.slots slots, every slot a
// worker that claims one turn (keyed, as the daemon's claims are;
// wait_ms 0), finishes it, and claims again until nothing is left. On
// PostgreSQL the same run gives the WAL written per turn, River's own
// client works off its jobs right after it on the same database (riverRun),
// and the whole protocol turn follows (b2Protocol).
func (b *bench) b2(ctx context.Context, k storeKind) error {
	n := b.size(20_000, 60)
	s, trips, closeStore, err := b.openCounted(ctx, k)
	if err != nil {
		return err
	}
	defer closeStore()
	hosts, err := b.fleet(ctx, s)
	if err != nil {
		return err
	}
	if _, err := queue(ctx, s, 16, n, []string{"agent"}); err != nil {
		return err
	}
	slots := b.o.hosts * b.o.slots
	sv, err := serve(s, slots)
	if err != nil {
		return err
	}
	defer sv.Close()
	b.logf("B2 %s: %d turns queued for %d hosts × %d slots", k, n, b.o.hosts, b.o.slots)
	var wal *walMeter
	if k == postgres {
		if wal, err = b.walMeter(ctx); err != nil {
			return err
		}
		defer wal.Close()
	}
	cpu := cpuClock()
	gc := s.GroupCommits()
	var took time.Duration
	var keep string
	if b.o.profiles != "" {
		keep = filepath.Join(b.o.profiles, fmt.Sprintf("B2-%s.pprof", k))
	}
	var walBytes int64
	share, why, err := profiled(ctx, keep, func() (err error) {
		if err := wal.start(ctx); err != nil {
			return err
		}
		took, err = b.work(ctx, sv, hosts, n, claimFinish)
		if err != nil {
			return err
		}
		walBytes, err = wal.since(ctx)
		return err
	})
	if err != nil {
		return err
	}
	load := loadAverage()
	cpu = cpuClock() - cpu
	gc = s.GroupCommits().Sub(gc)
	cf := row{ID: "B2", Store: k, What: fmt.Sprintf("HTTP claim → finish, %d hosts × %d slots", b.o.hosts, b.o.slots), Value: rate(n, took), Unit: "turns/s",
		Detail: fmt.Sprintf("%d turns; %s CPU per turn, server and clients in one process; load average %s", n, perOp(cpu, n), load)}
	b.rep.add(cf)
	if gc.Commits > 0 {
		// SQLite's single writer: each slot waits for its write's commit
		// before its next call.
		b.rep.add(row{ID: "B2", Store: k, What: "group commit in that run", Value: float64(gc.Writes) / float64(gc.Commits), Unit: "writes per commit",
			Detail: fmt.Sprintf("%d commits of %d writes, %s commits/s; the writer busy %.0f %% of the run", gc.Commits, gc.Writes,
				number(rate(int(gc.Commits), took)), 100*gc.Busy.Seconds()/took.Seconds())})
	}
	tokens := row{ID: "B2", Store: k, What: "token lookups, share of the control plane's CPU in that run", Value: 100 * share, Unit: "%",
		Detail: "CPU profile: samples in Server.host (with its host-token cache) and Server.attempt, of those outside the clients"}
	if why != "" {
		tokens.Value, tokens.NotRun = 0, why
	}
	b.rep.add(tokens)
	b.compare = append(b.compare, cf)
	if k == sqliteFull {
		return nil
	}
	walRow := row{ID: "B2", Store: k, What: "WAL bytes per turn, claim → finish", Value: float64(walBytes) / float64(n), Unit: "bytes",
		Detail: fmt.Sprintf("pg_current_wal_lsn() before and after that run, over %d turns: the whole server's WAL, other writers' too", n)}
	b.rep.add(walRow)

	// River right after, on the same server, while the load is the same.
	b.river(ctx)
	b.compareWAL = walRow

	if err := b.b2Protocol(ctx, k, s, sv, hosts, wal); err != nil {
		return err
	}
	if trips != nil {
		return b.roundTrips(ctx, s, sv, hosts[0], trips)
	}
	return nil
}

// b2Protocol is the whole protocol turn over HTTP from the same fleet:
// claim, renew, one event, admission, settlement and a succeeded finish,
// each its own request, as the daemon and its turn child make them.
func (b *bench) b2Protocol(ctx context.Context, k storeKind, s store.Store, sv *server, hosts []string, wal *walMeter) error {
	n := b.size(10_000, 40)
	if _, err := queue(ctx, s, 16, n, []string{"agent"}); err != nil {
		return err
	}
	var keep string
	if b.o.profiles != "" {
		keep = filepath.Join(b.o.profiles, fmt.Sprintf("B2-%s-protocol.pprof", k))
	}
	cpu := cpuClock()
	var took time.Duration
	var walBytes int64
	_, _, err := profiled(ctx, keep, func() (err error) {
		if err := wal.start(ctx); err != nil {
			return err
		}
		if took, err = b.work(ctx, sv, hosts, n, wholeTurn); err != nil {
			return err
		}
		walBytes, err = wal.since(ctx)
		return err
	})
	if err != nil {
		return err
	}
	cpu = cpuClock() - cpu
	whole := row{ID: "B2", Store: k, What: fmt.Sprintf("HTTP whole protocol turn (claim, renew, events, admission, settlement, finish), %d hosts × %d slots", b.o.hosts, b.o.slots),
		Value: rate(n, took), Unit: "turns/s",
		Detail: fmt.Sprintf("%d turns, 6 requests each; %s CPU per turn, server and clients in one process; load average %s", n, perOp(cpu, n), loadAverage())}
	b.rep.add(whole)
	b.compare = append(b.compare, whole)
	if wal != nil {
		b.rep.add(row{ID: "B2", Store: k, What: "WAL bytes per whole protocol turn", Value: float64(walBytes) / float64(n), Unit: "bytes",
			Detail: fmt.Sprintf("pg_current_wal_lsn() before and after that run, over %d turns", n)})
	}
	return nil
}

// fleet registers b.o.hosts hosts and returns their tokens.
func (b *bench) fleet(ctx context.Context, s store.Store) ([]string, error) {
	tokens := make([]string, b.o.hosts)
	for i := range tokens {
		_, tok, err := newHost(ctx, s, fmt.Sprintf("bench-%02d", i))
		if err != nil {
			return nil, err
		}
		tokens[i] = tok
	}
	return tokens, nil
}

// turnFunc runs one claimed turn's requests after its claim.
type turnFunc func(ctx context.Context, sv *server, c wire.Claim) error

// work runs every host's slots until the queue is empty and checks that
// exactly n turns were claimed and that a claim after them finds none.
func (b *bench) work(ctx context.Context, sv *server, hosts []string, n int, turn turnFunc) (time.Duration, error) {
	var done atomic.Int64
	took, err := parallel(ctx, len(hosts)*b.o.slots, len(hosts)*b.o.slots, func(ctx context.Context, i int) error {
		host := hosts[i%len(hosts)]
		for {
			c, err := sv.client.Claim(ctx, host, wire.ClaimRequest{WaitMS: 0, LeaseTTLMS: benchLease.Milliseconds(),
				IdempotencyKey: rand.Text()})
			if errors.Is(err, wire.ErrNoClaim) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			if err := turn(ctx, sv, c); err != nil {
				return err
			}
			done.Add(1)
		}
	})
	if err != nil {
		return took, err
	}
	if got := done.Load(); got != int64(n) {
		return took, fmt.Errorf("%d turns worked, want %d", got, n)
	}
	if _, err := sv.client.Claim(ctx, hosts[0], wire.ClaimRequest{WaitMS: 0}); !errors.Is(err, wire.ErrNoClaim) {
		return took, fmt.Errorf("a claim after %d turns: %v, want none left", n, err)
	}
	return took, nil
}

func claimFinish(ctx context.Context, sv *server, c wire.Claim) error {
	ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	if _, err := sv.client.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "bench"}); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	return nil
}

func wholeTurn(ctx context.Context, sv *server, c wire.Claim) error {
	ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	tok, job, act := c.WorkerToken, c.JobID, "act-"+c.AttemptID
	if _, err := sv.client.Renew(ctx, tok, job, wire.RenewRequest{AttemptRef: ref, LeaseTTLMS: benchLease.Milliseconds()}); err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if _, err := sv.client.Events(ctx, tok, job, wire.EventsRequest{AttemptRef: ref, Events: []wire.Event{{Seq: 1, Time: time.Now(), Type: "progress"}}}); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if _, err := sv.client.Admission(ctx, tok, job, wire.AdmissionRequest{AttemptRef: ref, ActivationID: act}); err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	if _, err := sv.client.Settlement(ctx, tok, job, wire.SettlementRequest{AttemptRef: ref, ActivationID: act,
		Supervisor: wire.SupervisorReceipt{ActivationID: act, ReceiptID: "rcpt-" + c.AttemptID, NativeTurn: 1}}); err != nil {
		return fmt.Errorf("settlement: %w", err)
	}
	if _, err := sv.client.Finish(ctx, tok, job, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded}); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	return nil
}

// walMeter reads PostgreSQL's WAL position on a connection of its own. A
// nil meter (SQLite) measures nothing.
type walMeter struct {
	db   *sql.DB
	from int64
}

func (b *bench) walMeter(ctx context.Context) (*walMeter, error) {
	db, err := sql.Open("pgx", b.o.postgres)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	m := &walMeter{db: db}
	if _, err := m.position(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return m, nil
}

func (m *walMeter) position(ctx context.Context) (int64, error) {
	var pos int64
	if err := m.db.QueryRowContext(ctx, "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").Scan(&pos); err != nil {
		return 0, fmt.Errorf("WAL position: %w", err)
	}
	return pos, nil
}

func (m *walMeter) start(ctx context.Context) (err error) {
	if m == nil {
		return nil
	}
	m.from, err = m.position(ctx)
	return err
}

// since is the WAL written since start, in bytes.
func (m *walMeter) since(ctx context.Context) (int64, error) {
	if m == nil {
		return 0, nil
	}
	to, err := m.position(ctx)
	return to - m.from, err
}

func (m *walMeter) Close() {
	if m != nil {
		m.db.Close()
	}
}

// riverResult is tools/riverbench's line.
type riverResult struct {
	River       string  `json:"river"`
	Driver      string  `json:"driver"`
	Jobs        int     `json:"jobs"`
	Workers     int     `json:"workers"`
	Seconds     float64 `json:"seconds"`
	JobsPerS    float64 `json:"jobs_per_s"`
	WALBytesPer float64 `json:"wal_bytes_per_job"`
}

// buildRiver builds tools/riverbench (its own module) into a temporary
// directory before any figure is taken, so that the build's CPU is spent
// outside every timed run. "" with why when -river names none; a module
// that does not build fails the run.
func (b *bench) buildRiver(ctx context.Context) (bin, why string) {
	if b.o.river == "" {
		return "", "-river is empty"
	}
	dir, err := os.MkdirTemp("", "runnerd-bench-river-")
	if err == nil {
		b.riverDir = dir
		bin = filepath.Join(dir, "riverbench")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
		cmd.Dir = b.o.river
		var out []byte
		if out, err = cmd.CombinedOutput(); err != nil {
			err = fmt.Errorf("go build in %s: %v: %s", b.o.river, err, firstLine(string(out)))
		}
	}
	if err != nil {
		b.failed = true
		b.logf("B2: River's bench: %v", err)
		return "", "failed: " + firstLine(err.Error())
	}
	return bin, ""
}

// river runs River's own client on the PostgreSQL of the run and adds its
// row; ratios compares the rows of b.compare with it.
func (b *bench) river(ctx context.Context) {
	jobs := b.size(b.o.riverJobs, 500)
	what := fmt.Sprintf("River claim → complete (own client, riverpgxv5, %d workers)", b.o.hosts*b.o.slots)
	if b.riverBin == "" {
		b.rep.add(row{ID: "B2", Store: postgres, What: what, NotRun: b.riverWhy})
		return
	}
	cmd := exec.CommandContext(ctx, b.riverBin, "-dsn", b.o.postgres, "-jobs", fmt.Sprint(jobs), "-workers", fmt.Sprint(b.o.hosts*b.o.slots))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var res riverResult
	err := cmd.Run()
	if err == nil {
		err = json.Unmarshal(stdout.Bytes(), &res)
	}
	if err != nil {
		b.failed = true
		b.rep.add(row{ID: "B2", Store: postgres, What: what, NotRun: "failed: " + firstLine(err.Error()+" "+stderr.String())})
		return
	}
	what = fmt.Sprintf("River %s claim → complete (own client, %s, %d workers)", res.River, res.Driver, res.Workers)
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	r := row{ID: "B2", Store: postgres, What: what, Value: res.JobsPerS, Unit: "jobs/s",
		Detail: fmt.Sprintf("%d jobs inserted, then worked off as `river bench -n` does; %s WAL bytes per job; %s CPU per job in River's process (insert and migrations too); load average %s",
			res.Jobs, number(res.WALBytesPer), perOp(cpu, res.Jobs), loadAverage())}
	b.rep.add(r)
	b.riverRes = &res
}

// ratios adds, once every store's B2 ran, each compared row's figure over
// River's from the same run: turns/s over jobs/s, WAL bytes per turn over
// WAL bytes per job.
func (b *bench) ratios() {
	if b.riverRes == nil {
		if len(b.compare) > 0 {
			b.logf("B2: no River figure in this run, so no ratio to it")
		}
		return
	}
	r := b.riverRes
	for _, x := range b.compare {
		b.rep.add(row{ID: "B2", Store: x.Store, What: x.What + ", over River's jobs/s", Value: x.Value / r.JobsPerS, Unit: "× River",
			Detail: fmt.Sprintf("%s turns/s over River %s's %s jobs/s in the same run", number(x.Value), r.River, number(r.JobsPerS))})
	}
	if x := b.compareWAL; x.Unit != "" && r.WALBytesPer > 0 {
		b.rep.add(row{ID: "B2", Store: x.Store, What: x.What + ", over River's per job", Value: x.Value / r.WALBytesPer, Unit: "× River",
			Detail: fmt.Sprintf("%s bytes per turn over River %s's %s bytes per job", number(x.Value), r.River, number(r.WALBytesPer))})
	}
}
