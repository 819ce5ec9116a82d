// Command bench is `make bench`: it runs the throughput benchmarks B1–B6
// of issue 14 against SQLite and, when a DSN is given, PostgreSQL, and
// writes their figures into docs/performance.md (between marker
// comments, replaced on each run) and into a JSON file.
//
//	B1  store operations: claim, renew, finish (16 callers)
//	B2  claim → finish over HTTP, 64 simulated hosts × 16 slots, River
//	    beside it on PostgreSQL (tools/riverbench), the whole protocol
//	    turn and the WAL written per turn
//	B3  whole turns through the daemon (process backend, real binaries)
//	B4  claim → ACCEPT latency on an idle host (p50, p99)
//	B5  cost per held turn (internal/bench/held)
//	B6  a renewal storm: every lease of N renewed at once, store and HTTP
//
// Each benchmark is sized to keep the whole run within ten minutes on a
// 2-core machine; -quick runs every one of them at a token size (the
// test of this command does, so that it cannot rot). Nothing here asserts
// a speed: the figures are measurements, printed with the machine, its
// load and the settings they were taken under.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options is the command line.
type options struct {
	quick     bool
	only      map[string]bool // benchmark ids to run; empty: all
	bin       string          // directory of the runnerd and demoagent binaries (make build)
	postgres  string          // DSN; empty: SQLite only
	doc       string          // markdown file whose generated section is replaced; empty: none
	json      string          // JSON file written; empty: none
	workers   int
	hosts     int    // simulated hosts of B2
	slots     int    // slots of each B2 host
	storm     int    // leases in B6
	profiles  string // directory B2 keeps its CPU profiles in; empty: none kept
	river     string // directory of the River bench module (tools/riverbench); empty: no River row
	riverJobs int    // jobs River works off in B2
}

func parse(args []string, getenv func(string) string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&o.quick, "quick", false, "every benchmark at a token size (seconds, not minutes)")
	only := fs.String("only", "", "comma-separated benchmark ids to run (e.g. B1,B6); default all")
	fs.StringVar(&o.bin, "bin", "bin", "directory holding runnerd, controlplane and demoagent (make build)")
	fs.StringVar(&o.postgres, "postgres", getenv("RUNNERD_TEST_POSTGRES"), "PostgreSQL DSN (default $RUNNERD_TEST_POSTGRES); empty: SQLite only")
	fs.StringVar(&o.doc, "doc", "docs/performance.md", "markdown file whose generated section is replaced (empty: none)")
	fs.StringVar(&o.json, "json", "docs/bench.json", "JSON file of the figures (empty: none)")
	fs.IntVar(&o.workers, "workers", 16, "concurrent workers of B1")
	fs.IntVar(&o.hosts, "hosts", 64, "simulated hosts of B2")
	fs.IntVar(&o.slots, "slots", 16, "slots of each B2 host, each a worker claiming and finishing turns")
	fs.StringVar(&o.river, "river", "tools/riverbench", "directory of the River bench module, built and run beside B2 on PostgreSQL (empty: no River row)")
	fs.IntVar(&o.riverJobs, "river-jobs", 100_000, "jobs River's client works off in B2")
	fs.IntVar(&o.storm, "storm", 100_000, "leases renewed at once in B6")
	fs.StringVar(&o.profiles, "profiles", "", "directory to keep B2's CPU profiles in, B2-STORE.pprof (empty: none kept)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.only = map[string]bool{}
	for _, id := range strings.Split(*only, ",") {
		if id = strings.ToUpper(strings.TrimSpace(id)); id != "" {
			o.only[id] = true
		}
	}
	if o.workers < 1 || o.storm < 1 || o.hosts < 1 || o.slots < 1 || o.riverJobs < 1 {
		return o, fmt.Errorf("-workers, -hosts, -slots, -river-jobs and -storm must be positive")
	}
	if o.quick && o.storm == 100_000 {
		o.storm = 500
	}
	if o.quick && o.hosts == 64 && o.slots == 16 {
		o.hosts, o.slots = 4, 4
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parse(args, getenv)
	if err != nil {
		fmt.Fprintln(stderr, "bench: "+err.Error())
		return 2
	}
	if o.profiles != "" {
		if err := os.MkdirAll(o.profiles, 0o755); err != nil {
			fmt.Fprintln(stderr, "bench: "+err.Error())
			return 1
		}
	}
	rep := newReport(o)
	start := time.Now()
	b := &bench{o: o, rep: rep, log: stderr}
	rep.progress = func(x row) { b.logf("%s", x.line()) }
	b.all(ctx)
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "bench: interrupted; nothing written")
		return 1
	}
	rep.finish(time.Since(start))
	fmt.Fprint(stdout, rep.markdown())
	if o.json != "" {
		if err := rep.writeJSON(o.json); err != nil {
			fmt.Fprintln(stderr, "bench: "+err.Error())
			return 1
		}
	}
	if o.doc != "" {
		if err := rep.splice(o.doc); err != nil {
			fmt.Fprintln(stderr, "bench: "+err.Error())
			return 1
		}
	}
	if b.failed {
		return 1
	}
	return 0
}

// bench runs the benchmarks of one invocation.
type bench struct {
	o      options
	rep    *report
	log    io.Writer
	failed bool // a benchmark failed: the status is 1

	// River beside B2 on PostgreSQL (b2.go).
	riverBin   string       // the built tools/riverbench; "" when there is none
	riverWhy   string       // why riverBin is ""
	riverDir   string       // the temporary directory holding riverBin
	riverRes   *riverResult // River's figures of this run; nil: not run
	compare    []row        // B2 rows whose ratio to River's jobs/s is added at the end
	compareWAL row          // B2's WAL bytes per turn on PostgreSQL, compared with River's per job
}

func (b *bench) want(id string) bool { return len(b.o.only) == 0 || b.o.only[id] }

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s bench: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// all runs each benchmark on each store. A benchmark that fails leaves a
// row saying so, never a figure, and the command's status is 1; the others
// still run, so that one failure does not cost the whole run's figures.
func (b *bench) all(ctx context.Context) {
	stores := []storeKind{sqliteFull}
	if b.o.postgres != "" {
		stores = append(stores, postgres)
		if b.want("B2") {
			b.riverBin, b.riverWhy = b.buildRiver(ctx)
			if b.riverDir != "" {
				defer os.RemoveAll(b.riverDir)
			}
		}
	}
	for _, k := range stores {
		b.one(ctx, "B1", k, func() error { return b.b1(ctx, k) })
		b.one(ctx, "B2", k, func() error { return b.b2(ctx, k) })
		b.one(ctx, "B6", k, func() error { return b.b6(ctx, k) })
	}
	if b.want("B2") {
		b.ratios()
	}
	b.one(ctx, "B3", sqliteFull, func() error { return b.b3(ctx) })
	b.one(ctx, "B4", sqliteFull, func() error { return b.b4(ctx, sandbox.BackendProcess) })
	if b.want("B4") && dockerAnswers(ctx) {
		b.one(ctx, "B4", sqliteFull, func() error { return b.b4(ctx, sandbox.BackendDocker) })
	} else if b.want("B4") {
		b.logf("B4: no Docker engine answers; the Docker row is left out")
	}
	b.one(ctx, "B5", "", func() error { return b.b5(ctx) })
}

// one runs benchmark id unless -only leaves it out, and turns its error
// into a row.
func (b *bench) one(ctx context.Context, id string, k storeKind, f func() error) {
	if !strings.Contains(id, "/") && !b.want(id) {
		return
	}
	if err := ctx.Err(); err != nil {
		return
	}
	if err := f(); err != nil {
		b.failed = true
		b.logf("%s %s failed: %v", id, k, err)
		b.rep.add(row{ID: id, Store: k, What: "(failed)", NotRun: "failed: " + firstLine(err.Error())})
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
