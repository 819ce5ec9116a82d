// Command riverbench is River's side of `make bench`'s B2: River's own
// client (github.com/riverqueue/river with its pgx v5 driver) working off
// N jobs on the same PostgreSQL the control plane's rows ran on, the way
// River's `river bench -n N` measures it, so that runnerd's claim → finish
// has a yardstick taken in the same minute on the same machine.
//
// It lives in a module of its own so that the product's go.mod never
// depends on River: cmd/bench builds it from this directory and reads the
// one JSON line it prints.
//
// A run: a fresh schema of its own (riverbench_…), River's migrations run
// into it (rivermigrate), N jobs inserted in batches of 5,000 before the
// clock starts (InsertManyFast, COPY), then a client with -workers workers
// on the default queue is started and the clock runs from Start until the
// subscription has seen the last job completed — a job counts once River's
// completer has written it, not when its Work returns. The database's WAL
// position is read before Start and after the last completion; the
// difference over N is River's WAL bytes per job (the whole cluster's WAL:
// anything else writing to the same server in that window counts too).
// The schema is dropped afterwards.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// result is the line printed on stdout.
type result struct {
	River        string  `json:"river"`  // River's module version, from the build
	Driver       string  `json:"driver"` // riverpgxv5
	Jobs         int     `json:"jobs"`
	Workers      int     `json:"workers"`
	Seconds      float64 `json:"seconds"`
	JobsPerS     float64 `json:"jobs_per_s"`
	WALBytes     int64   `json:"wal_bytes"`
	WALBytesPer  float64 `json:"wal_bytes_per_job"`
	InsertSecond float64 `json:"insert_seconds"` // inserting the N jobs, before the clock
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "riverbench: "+err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("riverbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", os.Getenv("RUNNERD_TEST_POSTGRES"), "PostgreSQL DSN (default $RUNNERD_TEST_POSTGRES)")
	jobs := fs.Int("jobs", 100_000, "jobs inserted, then worked off")
	workers := fs.Int("workers", 1024, "MaxWorkers of the default queue")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dsn == "" {
		return errors.New("no DSN: -dsn or $RUNNERD_TEST_POSTGRES")
	}
	if *jobs < 1 || *workers < 1 {
		return errors.New("-jobs and -workers must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "riverbench_" + strings.ToLower(rand.Text())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer func() {
		// The run's context may be spent: the schema goes all the same.
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if _, err := pool.Exec(dctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			fmt.Fprintf(stderr, "riverbench: drop schema %s: %v\n", schema, err)
		}
	}()

	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema, Logger: quiet()})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	workersSet := river.NewWorkers()
	river.AddWorker(workersSet, river.WorkFunc(func(context.Context, *river.Job[benchArgs]) error { return nil }))
	client, err := river.NewClient(driver, &river.Config{
		Schema: schema,
		// The settings River's own `river bench` runs with: a short fetch
		// cooldown and poll interval, many workers on one queue.
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            quiet(),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
		Workers:           workersSet,
	})
	if err != nil {
		return err
	}
	done, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: *jobs + 1,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancelSub()

	insertStart := time.Now()
	const batch = 5_000
	params := make([]river.InsertManyParams, 0, batch)
	for i := 0; i < *jobs; i += batch {
		params = params[:0]
		for j := i; j < min(i+batch, *jobs); j++ {
			params = append(params, river.InsertManyParams{Args: benchArgs{Num: j}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
	}
	inserted := time.Since(insertStart)

	walBefore, err := walPosition(ctx, pool)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	for n := 0; n < *jobs; {
		select {
		case ev := <-done:
			if ev.Kind != river.EventKindJobCompleted {
				_ = client.Stop(context.Background())
				return fmt.Errorf("job %d: %s, want completed", ev.Job.ID, ev.Kind)
			}
			n++
		case <-ctx.Done():
			_ = client.Stop(context.Background())
			return fmt.Errorf("%d of %d jobs completed: %w", n, *jobs, ctx.Err())
		}
	}
	took := time.Since(start)
	walAfter, err := walPosition(ctx, pool)
	if err != nil {
		return err
	}
	if err := client.Stop(ctx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".river_job WHERE state <> 'completed'").Scan(&left); err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("%d jobs not completed after the run", left)
	}
	out := result{River: riverVersion(), Driver: "riverpgxv5", Jobs: *jobs, Workers: *workers,
		Seconds: took.Seconds(), JobsPerS: float64(*jobs) / took.Seconds(),
		WALBytes: walAfter - walBefore, WALBytesPer: float64(walAfter-walBefore) / float64(*jobs),
		InsertSecond: inserted.Seconds()}
	return json.NewEncoder(stdout).Encode(out)
}

type benchArgs struct {
	Num int `json:"num"`
}

func (benchArgs) Kind() string { return "benchmark" }

// walPosition is the server's current WAL position in bytes.
func walPosition(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var pos int64
	err := pool.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").Scan(&pos)
	if err != nil {
		return 0, fmt.Errorf("WAL position: %w", err)
	}
	return pos, nil
}

// riverVersion is the version of River this binary was built with.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/riverqueue/river" {
				return m.Version
			}
		}
	}
	return "unknown"
}

// quiet is River's logger here: warnings and errors only, on stderr.
func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
