// Command demo is runnerd's one-command demo (`make demo`). Given the
// directory of the built binaries (default ./bin), it starts the reference
// control plane on SQLite in a temporary directory and one host daemon
// with the process sandbox backend and the demo agent, runs three
// conversations through three turns each — one of them silent for several
// renewal intervals, one carrying a directive the product must ignore
// (K12) — prints a table of the turns, shuts everything down (a drain,
// then SIGTERM to the control plane) and exits 0, or 1 if any turn ended other than expected.
//
// With --dev it starts the same two programs, prints the Admin → Servers
// address and how to send a message, and keeps them up until interrupted
// (`make dev`).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// Demo timings: short enough that the demo takes seconds, long enough that
// the silent turn spans several renewals (R9).
const (
	renewInterval = 2 * time.Second
	renewTimeout  = time.Second
	renewRetry    = 500 * time.Millisecond
	leaseTTL      = 6 * time.Second
	stopGrace     = time.Second
	killGrace     = time.Second
	reaperGrace   = 3 * time.Second // at least stopGrace + killGrace (P3)
	silentFor     = 5 * time.Second // two and a half renewal intervals
	turnsDeadline = 2 * time.Minute
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	bin, listen, sandbox, host string
	agent                      string // lines or acp
	dev, keep                  bool
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bin, "bin", "bin", "directory of the built runnerd, controlplane and demoagent")
	fs.BoolVar(&o.dev, "dev", false, "start the control plane and one daemon, print their addresses and keep them up until interrupted")
	fs.StringVar(&o.listen, "listen", "", "control plane address (default 127.0.0.1:0 for the demo, 127.0.0.1:8080 with --dev)")
	fs.StringVar(&o.sandbox, "sandbox", "process", "sandbox backend of the daemon: process or docker")
	fs.StringVar(&o.host, "host-name", "demo-host", "the daemon's host name (the docker backend labels its containers with it)")
	fs.StringVar(&o.agent, "agent", wire.AgentProtocolLines, "how the daemon speaks to the demo agent: lines or acp (the Agent Client Protocol, demoagent --acp)")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary directory (database, logs, workspaces) afterwards")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if o.agent != wire.AgentProtocolLines && o.agent != wire.AgentProtocolACP {
		fmt.Fprintf(stderr, "demo: --agent must be %s or %s\n", wire.AgentProtocolLines, wire.AgentProtocolACP)
		return 2
	}
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
		if o.dev {
			o.listen = "127.0.0.1:8080"
		}
	}
	bins, err := fleet.BinariesIn(o.bin)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "runnerd-demo-")
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	keep := o.keep || o.dev
	defer func() {
		if keep {
			fmt.Fprintf(stdout, "\nEverything (database, logs, workspaces) is kept in %s\n", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	f, err := up(ctx, o, bins, dir, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		keep = true
		if f != nil {
			f.down(stdout)
		}
		return 1
	}
	sb, err := prepareSandbox(ctx, o.sandbox, bins, f, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		keep = true
		f.down(stdout)
		return 1
	}
	if o.agent == wire.AgentProtocolACP {
		// The same conversations over ACP: the demo agent's ACP side, its
		// permission requests (none in these scripts) allowed.
		sb.agent = append(sb.agent, "--acp")
		sb.protocol, sb.permission = wire.AgentProtocolACP, wire.PermissionAllow
	}
	if o.dev {
		f.printDev(stdout, sb)
		<-ctx.Done()
		fmt.Fprintln(stdout, "\nstopping…")
		err := f.down(stdout)
		if sb.cleanupAll != nil {
			err = errors.Join(err, sb.cleanupAll(context.WithoutCancel(ctx)))
		}
		if err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 1
		}
		return 0
	}
	turns, convIDs, runErr := runConversations(ctx, f, sb)
	printTable(stdout, turns)
	downErr := f.down(stdout)
	if sb.cleanup != nil {
		downErr = errors.Join(downErr, sb.cleanup(context.WithoutCancel(ctx), convIDs))
	}
	bad := 0
	for _, t := range turns {
		if t.problem != "" {
			bad++
		}
	}
	switch {
	case runErr != nil:
		fmt.Fprintln(stderr, "demo:", runErr)
	case bad > 0:
		fmt.Fprintf(stderr, "demo: %d turn(s) did not end as expected (see the last column)\n", bad)
	case downErr != nil:
		fmt.Fprintln(stderr, "demo:", downErr)
	default:
		explain(stdout, sb.transcripts)
		return 0
	}
	keep = true
	fmt.Fprintf(stderr, "demo: logs: %s\n", filepath.Join(dir, "*.log"))
	return 1
}

// running is the demo's fleet: one control plane, one daemon.
type running struct {
	dir       string
	bins      fleet.Binaries
	cp        *fleet.ControlPlane
	d         *fleet.Daemon
	stateDir  string
	host      string
	logs      []*os.File
	tokenFile string
}

func up(ctx context.Context, o options, bins fleet.Binaries, dir string, stdout io.Writer) (*running, error) {
	f := &running{dir: dir, bins: bins, stateDir: filepath.Join(dir, "state"), host: o.host}
	cpLog, err := f.logFile("controlplane.log")
	if err != nil {
		return nil, err
	}
	f.cp, err = fleet.StartControlPlane(ctx, fleet.ControlPlaneConfig{
		Bin:            bins.ControlPlane,
		DataDir:        filepath.Join(dir, "controlplane"),
		Listen:         o.listen,
		LeaseTTL:       leaseTTL,
		MinLeaseTTL:    renewInterval + renewTimeout,
		ReaperInterval: 500 * time.Millisecond,
		ReaperGrace:    reaperGrace,
		ClaimWaitMax:   5 * time.Second,
		ReleaseBackoff: 500 * time.Millisecond, // scaled down with the leases (K7)
		Log:            cpLog,
	})
	if err != nil {
		return f, err
	}
	f.tokenFile, err = f.cp.AddHost(ctx, f.host)
	if err != nil {
		return f, err
	}
	dLog, err := f.logFile("runnerd.log")
	if err != nil {
		return f, err
	}
	f.d, err = fleet.StartDaemon(ctx, fleet.DaemonConfig{
		Bin:             bins.Runnerd,
		ControlPlaneURL: f.cp.URL,
		HostTokenFile:   f.tokenFile,
		HostName:        f.host,
		StateDir:        f.stateDir,
		Capacity:        3,
		Sandbox:         o.sandbox,
		LeaseTTL:        leaseTTL,
		RenewInterval:   renewInterval,
		RenewTimeout:    renewTimeout,
		RenewRetry:      renewRetry,
		ReceiptTimeout:  2 * time.Second,
		ReceiptRetry:    500 * time.Millisecond,
		StopGrace:       stopGrace,
		KillGrace:       killGrace,
		DrainTimeout:    30 * time.Second,
		ClaimWait:       5 * time.Second,
		ClaimBackoff:    500 * time.Millisecond,
		ClaimBackoffMax: 5 * time.Second,
		LaunchBackoff:   2 * time.Second,
		ControlTimeout:  5 * time.Second,
		HostHeartbeat:   time.Second,
		Log:             dLog,
	})
	if err != nil {
		return f, err
	}
	fmt.Fprintf(stdout, "runnerd demo: control plane %s on SQLite (%s), one host daemon (%s sandbox, the demo agent)\n",
		f.cp.URL, filepath.Join(dir, "controlplane"), o.sandbox)
	fmt.Fprintf(stdout, "timings: lease %v, renewed every %v (%v timeout, %v retry)\n", leaseTTL, renewInterval, renewTimeout, renewRetry)

	// Up means the host's first heartbeat has arrived.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = fleet.Poll(wctx, 100*time.Millisecond, "the daemon's first host heartbeat", func(ctx context.Context) (bool, error) {
		select {
		case <-f.d.Done():
			return false, fmt.Errorf("runnerd exited: %v (see %s)", f.d.Err(), dLog.Name())
		default:
		}
		s, ok, err := f.cp.User.Server(ctx, f.host)
		return ok && s.LastHeartbeat != nil, err
	})
	return f, err
}

func (f *running) logFile(name string) (*os.File, error) {
	l, err := os.OpenFile(filepath.Join(f.dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err == nil {
		f.logs = append(f.logs, l)
	}
	return l, err
}

// down drains the daemon (SIGUSR1, as `runnerd drain` sends: the demo's
// host goes out of service; SIGTERM would hand its turns over to a next
// start that never comes), then stops the control plane, then
// whatever supervisors remain (they outlive a daemon by design).
func (f *running) down(stdout io.Writer) error {
	var errs []error
	var done []string
	if f.d != nil {
		errs = append(errs, f.d.Stop(syscall.SIGUSR1, 45*time.Second))
		if code := f.d.ExitCode(); code != 0 {
			errs = append(errs, fmt.Errorf("runnerd exited with status %d", code))
		}
		done = append(done, fmt.Sprintf("runnerd drained and exited %d", f.d.ExitCode()))
	}
	if f.cp != nil {
		errs = append(errs, f.cp.Stop(syscall.SIGTERM, 15*time.Second))
		done = append(done, fmt.Sprintf("the control plane exited %d", f.cp.ExitCode()))
	}
	if n, err := fleet.StopProcs(5*time.Second, fleet.Under(f.stateDir)); err != nil {
		errs = append(errs, err)
	} else if n > 0 {
		done = append(done, fmt.Sprintf("%d retained sandbox supervisor(s) stopped", n))
	}
	fmt.Fprintf(stdout, "\nshutdown (drain, wait): %s\n", strings.Join(done, "; "))
	for _, l := range f.logs {
		l.Close()
	}
	return errors.Join(errs...)
}

func (f *running) printDev(stdout io.Writer, sb sandboxSetup) {
	tok := filepath.Join(f.dir, "controlplane", "user-token")
	fmt.Fprintf(stdout, `
Admin → Servers: %s/admin/servers   (any user name; the password is the token in %s)
Send a message:  %s submit --server %s --user-token-file %s --new --image %s --agent %s --prompt 'hello'
Logs:            %s
Interrupt (Ctrl-C) to stop both.
`, f.cp.URL, tok, f.bins.ControlPlane, f.cp.URL, tok, sb.image, strings.Join(sb.agent, " "), filepath.Join(f.dir, "*.log"))
}

// ---- the scripted conversations ----

// script is one turn: the prompt and what the demo expects of it.
type script struct {
	prompt   string
	attempts int    // attempts expected, released ones included
	note     string // what the turn shows
}

var conversations = []struct {
	title string
	turns []script
}{
	{"alpha", []script{
		{prompt: "Hello, alpha.\n!events 3", attempts: 1, note: "3 events streamed"},
		// "!decline-first" once made the product's turn child decline; now only
		// prompt-blind checks decide a decline, and this turn runs once (K12).
		{prompt: "Second turn.\n!decline-first\n!events 2", attempts: 1, note: "an old demo directive in the prompt changed nothing (K12)"},
		{prompt: "Third turn.\n!events 2", attempts: 1, note: "native session continues"},
	}},
	{"bravo", []script{
		{prompt: "Hello, bravo.\n!events 2", attempts: 1, note: "2 events streamed"},
		{prompt: fmt.Sprintf("A quiet turn.\n!silent %v\n!events 1", silentFor), attempts: 1,
			note: fmt.Sprintf("silent %v, over %d renewals: the lease held (R9)", silentFor, int(silentFor/renewInterval))},
		{prompt: "Third turn.\n!events 1", attempts: 1, note: "native session continues"},
	}},
	{"charlie", []script{
		{prompt: "Hello, charlie.\n!events 1", attempts: 1, note: "1 event streamed"},
		{prompt: "Second turn.\n!events 4", attempts: 1, note: "4 events streamed"},
		{prompt: "Third turn.\n!events 1", attempts: 1, note: "native session continues"},
	}},
}

// turnRow is one line of the table.
type turnRow struct {
	conversation string
	seq          int64
	outcome      string
	attempts     int
	released     int
	took         time.Duration
	nativeTurn   int64
	note         string
	problem      string
}

// sandboxSetup is what a conversation needs on one backend.
type sandboxSetup struct {
	backend string // the conversations' sandbox requirement (routing)
	image   string
	agent   []string
	// protocol and permission are the conversations' agent_protocol and
	// permission_policy ("" for lines).
	protocol, permission string
	// transcripts: the agent's workspace is a host directory the demo can read.
	transcripts bool
	// cleanup removes what the backend keeps after the daemon is gone;
	// cleanupAll does so for every conversation of the host (--dev).
	cleanup    func(ctx context.Context, conversationIDs []string) error
	cleanupAll func(ctx context.Context) error
}

// prepareSandbox readies the backend: nothing for process; for docker, the
// demo agent's image, built FROM scratch (no registry needed), and a
// cleanup of the retained containers and volumes.
func prepareSandbox(ctx context.Context, backend string, bins fleet.Binaries, f *running, stdout io.Writer) (sandboxSetup, error) {
	if backend != "docker" {
		return sandboxSetup{backend: wire.SandboxProcess, image: "demo", agent: []string{bins.DemoAgent}, transcripts: true}, nil
	}
	engine, err := docker.EngineFromEnv()
	if err != nil {
		return sandboxSetup{}, fmt.Errorf("docker: %w", err)
	}
	const tag = "runnerd-demo/agent:dev"
	if err := docker.BuildScratchImage(ctx, engine, docker.ScratchImage{
		Tag:   tag,
		Files: []docker.ImageFile{{Path: "/demoagent", Source: bins.DemoAgent, Exec: true}},
		// A non-root agent: the supervisor's state is then out of its reach.
		User: "65534:65534",
	}); err != nil {
		return sandboxSetup{}, err
	}
	fmt.Fprintf(stdout, "docker: built %s FROM scratch with the demo agent\n", tag)
	be, err := docker.New(docker.Config{Engine: engine, Host: f.host, StateDir: f.stateDir, RunnerdPath: bins.Runnerd})
	if err != nil {
		return sandboxSetup{}, err
	}
	return sandboxSetup{backend: wire.SandboxDocker, image: tag, agent: []string{"/demoagent"}, cleanup: func(ctx context.Context, ids []string) error {
		var errs []error
		for _, id := range ids {
			errs = append(errs, be.Remove(ctx, id))
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("remove the demo's containers: %w", err)
		}
		fmt.Fprintf(stdout, "docker: removed the %d conversations' containers and volumes\n", len(ids))
		return nil
	}, cleanupAll: func(ctx context.Context) error {
		res, err := be.Sweep(ctx, func(string) bool { return true })
		if err != nil {
			return fmt.Errorf("remove the containers of host %s: %w", f.host, err)
		}
		fmt.Fprintf(stdout, "docker: removed the containers and volumes of %d conversation(s) of host %s\n", len(res.Removed), f.host)
		return nil
	}}, nil
}

// runConversations sends every message up front — the control plane runs
// one turn of a conversation at a time, in order — and waits for them.
func runConversations(ctx context.Context, f *running, sb sandboxSetup) ([]turnRow, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, turnsDeadline)
	defer cancel()
	u := f.cp.User
	type sent struct {
		conv   wire.Conversation
		job    wire.Job
		script script
	}
	var all []sent
	var ids []string
	convs := make([]wire.Conversation, len(conversations))
	for i, c := range conversations {
		conv, err := u.Create(ctx, wire.CreateConversationRequest{Title: c.title, Image: sb.image, AgentCommand: sb.agent, Sandbox: sb.backend,
			AgentProtocol: sb.protocol, PermissionPolicy: sb.permission})
		if err != nil {
			return nil, ids, fmt.Errorf("create conversation %s: %w", c.title, err)
		}
		convs[i] = conv
		ids = append(ids, conv.ID)
	}
	for k := range 3 {
		for i, c := range conversations {
			j, err := u.Send(ctx, convs[i].ID, c.turns[k].prompt)
			if err != nil {
				return nil, ids, fmt.Errorf("send turn %d of %s: %w", k+1, c.title, err)
			}
			all = append(all, sent{conv: convs[i], job: j, script: c.turns[k]})
		}
	}

	rows := make([]turnRow, 0, len(all))
	for i, s := range all {
		title := conversations[i%len(conversations)].title
		j, err := u.WaitEnded(ctx, s.job.ID, 100*time.Millisecond)
		if err != nil {
			return rows, ids, fmt.Errorf("%s turn %d: %w", title, s.job.Seq, err)
		}
		rows = append(rows, row(title, j, s.script))
	}
	sortRows(rows)
	if !sb.transcripts {
		return rows, ids, nil
	}
	// Every prompt reached its agent once, in order (the demo agent's transcript).
	for i, c := range convs {
		tr, err := fleet.Transcript(f.stateDir, c.ID)
		if err != nil {
			return rows, ids, err
		}
		for k, want := range conversations[i].turns {
			if k >= len(tr) || tr[k].Prompt != want.prompt || tr[k].Turn != int64(k+1) || len(tr) != len(conversations[i].turns) {
				markProblem(rows, conversations[i].title, int64(k+1), "the agent's transcript differs: a prompt missing or repeated")
			}
		}
	}
	return rows, ids, nil
}

func row(title string, j wire.Job, s script) turnRow {
	r := turnRow{conversation: title, seq: j.Seq, outcome: j.State, attempts: len(j.Attempts), note: s.note}
	for _, a := range j.Attempts {
		if a.State == wire.AttemptReleased {
			r.released++
		}
	}
	if len(j.Attempts) > 0 && j.EndedAt != nil {
		r.took = j.EndedAt.Sub(j.Attempts[0].ClaimedAt)
	}
	for _, ev := range j.Events {
		if ev.Type == "settled" {
			var b struct {
				NativeTurn int64 `json:"native_turn"`
			}
			if json.Unmarshal(ev.Data, &b) == nil {
				r.nativeTurn = b.NativeTurn
			}
		}
	}
	switch {
	case j.State != wire.JobSucceeded:
		r.problem = "expected succeeded: " + j.Reason
	case r.attempts != s.attempts:
		r.problem = fmt.Sprintf("expected %d attempt(s)", s.attempts)
	case r.nativeTurn != j.Seq:
		r.problem = fmt.Sprintf("settled at native turn %d, expected %d", r.nativeTurn, j.Seq)
	}
	return r
}

func markProblem(rows []turnRow, conv string, seq int64, problem string) {
	for i := range rows {
		if rows[i].conversation == conv && rows[i].seq == seq && rows[i].problem == "" {
			rows[i].problem = problem
		}
	}
}

func sortRows(rows []turnRow) {
	order := map[string]int{}
	for i, c := range conversations {
		order[c.title] = i
	}
	for i := 1; i < len(rows); i++ {
		for k := i; k > 0; k-- {
			a, b := rows[k-1], rows[k]
			if order[a.conversation] < order[b.conversation] || order[a.conversation] == order[b.conversation] && a.seq <= b.seq {
				break
			}
			rows[k-1], rows[k] = b, a
		}
	}
}

func printTable(w io.Writer, rows []turnRow) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONVERSATION\tTURN\tOUTCOME\tATTEMPTS\tTIME\tNATIVE TURN\tWHAT IT SHOWS")
	for _, r := range rows {
		att := fmt.Sprint(r.attempts)
		if r.released > 0 {
			att += fmt.Sprintf(" (%d released)", r.released)
		}
		note := r.note
		if r.problem != "" {
			note = "UNEXPECTED: " + r.problem
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.1fs\t%d\t%s\n", r.conversation, r.seq, r.outcome, att, r.took.Seconds(), r.nativeTurn, note)
	}
	tw.Flush()
}

func explain(w io.Writer, transcripts bool) {
	fmt.Fprint(w, `
All nine turns ended as expected. Each ran in its own child process
("runnerd-child turn") under a lease the daemon renewed on its own schedule; each
conversation kept one supervisor and one native agent session across its
three turns, so the native turn ordinal went 1, 2, 3.
`)
	if transcripts {
		fmt.Fprintln(w, "Every prompt reached the agent exactly once: the agent's own transcripts say so.")
	}
}
