// Package fleet starts and drives the real runnerd binaries — the reference
// control plane on SQLite, host daemons, the demo agent — as child
// processes, and speaks the user API to them. It is what the integration
// tests (package integration) and the one-command demo (cmd/demo) are made
// of, and the benchmarks that measure a whole host (internal/bench); nothing
// else may import it. It imports wire and golang.org/x/sys.
package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binaries names the built executables, all in one directory.
type Binaries struct {
	Runnerd      string
	ControlPlane string
	DemoAgent    string
	Demo         string // cmd/demo; "" when the directory has none
	// RunnerdChild is the process backend's lean turn child and supervisor
	// (cmd/runnerd-child), which runnerd starts when it lies beside it; ""
	// when the directory has none.
	RunnerdChild string
}

// BinariesIn returns the executables in dir (as `make build` leaves them in
// bin/) and checks that each is there.
func BinariesIn(dir string) (Binaries, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{
		Runnerd:      filepath.Join(abs, "runnerd"),
		ControlPlane: filepath.Join(abs, "controlplane"),
		DemoAgent:    filepath.Join(abs, "demoagent"),
	}
	for _, p := range []string{b.Runnerd, b.ControlPlane, b.DemoAgent} {
		if !isExecutable(p) {
			return Binaries{}, fmt.Errorf("%s is not an executable (build the binaries first)", p)
		}
	}
	if demo := filepath.Join(abs, "demo"); isExecutable(demo) {
		b.Demo = demo
	}
	if child := filepath.Join(abs, "runnerd-child"); isExecutable(child) {
		b.RunnerdChild = child
	}
	return b, nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Build builds the binaries of module root into dir, statically
// (CGO_ENABLED=0), as the Makefile does.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", dir+"/",
		"./cmd/runnerd", "./cmd/runnerd-child", "./cmd/controlplane", "./cmd/demoagent", "./cmd/demo")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return BinariesIn(dir)
}

// Process is a child process started by this package: its exit is watched
// by one goroutine, which Wait and Done expose.
type Process struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done closes
}

// start starts cmd and the goroutine that waits for it.
func start(name string, cmd *exec.Cmd) (*Process, error) {
	// Its own process group, so that a terminal's ^C reaches only the
	// program that started it, which then stops the fleet in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the result of exec.Cmd.Wait; valid after Done.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// ExitCode is the exit status, -1 for a signal; valid after Done.
func (p *Process) ExitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig unless the process has already been waited for.
func (p *Process) Signal(sig os.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the exit.
func (p *Process) Wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("%s (pid %d) still running after %v", p.Name, p.Pid(), timeout)
	}
}

// Stop sends sig, waits up to grace, then kills the process and waits for
// it. It returns an error if the process had to be killed.
func (p *Process) Stop(sig os.Signal, grace time.Duration) error {
	p.Signal(sig)
	if err := p.Wait(grace); err == nil {
		return nil
	}
	p.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not exit within %v of %v and was killed", p.Name, grace, sig)
}

// lineWatch copies a child's output to a writer line by line and lets
// callers wait for a line matching a pattern.
type lineWatch struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
	closed  bool
}

func newLineWatch() *lineWatch { return &lineWatch{changed: make(chan struct{})} }

// copy reads r to its end; each line goes to out (if not nil) and is kept.
func (w *lineWatch) copy(r io.Reader, out io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if out != nil {
			fmt.Fprintln(out, line)
		}
		w.mu.Lock()
		if len(w.lines) < 10000 {
			w.lines = append(w.lines, line)
		}
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.closed = true
	close(w.changed)
	w.mu.Unlock()
}

// mark is the number of lines read so far.
func (w *lineWatch) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}

// await returns the submatches of the first line from line number from
// on that matches re, waiting up to timeout for it.
func (w *lineWatch) await(from int, re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := from
	for {
		w.mu.Lock()
		for ; seen < len(w.lines); seen++ {
			if m := re.FindStringSubmatch(w.lines[seen]); m != nil {
				w.mu.Unlock()
				return m, nil
			}
		}
		closed, changed := w.closed, w.changed
		w.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("output ended without a line matching %q", re)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, fmt.Errorf("no line matching %q within %v", re, timeout)
		}
	}
}

// text is everything read so far, for an error message.
func (w *lineWatch) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// startWatched starts cmd with its stderr watched (and copied to log) and
// its stdout sent to log as well.
func startWatched(name string, cmd *exec.Cmd, log io.Writer) (*Process, *lineWatch, error) {
	if log == nil {
		log = io.Discard
	}
	log = &lockedWriter{w: log}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = pw
	cmd.Stdout = log
	p, err := start(name, cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, nil, err
	}
	// The copy ends when every holder of the pipe has exited: the child
	// and any descendant that inherited its stderr.
	w := newLineWatch()
	go func() {
		defer pr.Close()
		w.copy(pr, log)
	}()
	return p, w, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
