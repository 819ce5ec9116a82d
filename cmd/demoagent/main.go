// Command demoagent is a small, deterministic agent for the demo and the
// tests. It reads the whole prompt on stdin, keeps a native session in its
// working directory (the workspace), and writes JSON-lines events on stdout.
//
// The native session is two files under .demoagent/: "turn", the last turn
// ordinal, and "transcript.jsonl", one line per prompt received, appended
// before anything else happens — so a test can prove that no prompt ever
// reached the agent twice, and that a resumed conversation continues its
// ordinal.
//
// Lines of the prompt that start with "!" are directives, run in order:
//
//	!events N     emit N "message.delta" events
//	!silent D     write nothing for duration D (e.g. 400s, 6m)
//	!sleep D      emit one "status" event, then sleep D
//	!exit N       exit with status N at once (no "turn.completed")
//	!crash        kill itself with SIGKILL
//	!hang         never end
//	!await NAME   write nothing until the file NAME (relative to the
//	              workspace) exists: a test's turn that lasts until the
//	              test lets it end, however slow the machine
//	!hog          allocate and touch memory until the OOM killer ends it
//	!forkbomb     start idle copies of itself until a start fails (the
//	              pids limit), then exit 1, leaving them running
//	!ignoreterm   ignore SIGTERM from here on (the turn goes on)
//	!escape       start an idle copy of itself in a session of its own,
//	              out of its process group, report its pid (a "status"
//	              event with "pid"), and go on: a process a group kill
//	              does not reach
//	!fill PATH    write PATH (absolute, or relative to the workspace)
//	              until a write fails (the filesystem is full), then exit 1
//
// With --acp it speaks the Agent Client Protocol instead (acp.go).
//
// Any other directive is reported as an "unknown_directive" event and
// ignored. Directives live here only: the product never reads a prompt for
// them (K12). Other lines are echoed as one "message" event. Every event
// carries "native_turn".
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--acp" {
		os.Exit(runACP(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "--idle" { // a !forkbomb copy
		for {
			time.Sleep(time.Hour)
		}
	}
	end := run(os.Stdin, os.Stdout, ".")
	switch {
	case end.crash:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		for {
			time.Sleep(time.Hour)
		}
	case end.hang:
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(end.code)
}

// ending is how a turn ends: an exit code, or a crash, or never.
type ending struct {
	code  int
	crash bool
	hang  bool
}

type agent struct {
	out  *bufio.Writer
	turn int64
	err  error
}

func (a *agent) emit(ev map[string]any) {
	if a.err != nil {
		return
	}
	ev["native_turn"] = a.turn
	b, err := json.Marshal(ev)
	if err == nil {
		_, err = a.out.Write(append(b, '\n'))
	}
	if err == nil {
		err = a.out.Flush() // one event per flush: readers synchronise on them
	}
	a.err = err
}

func run(stdin io.Reader, stdout io.Writer, dir string) ending {
	prompt, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demoagent: read prompt:", err)
		return ending{code: 1}
	}
	turn, err := advance(filepath.Join(dir, ".demoagent"), string(prompt))
	if err != nil {
		fmt.Fprintln(os.Stderr, "demoagent: session:", err)
		return ending{code: 1}
	}
	a := &agent{out: bufio.NewWriter(stdout), turn: turn}
	a.emit(map[string]any{"type": "turn.started", "pid": os.Getpid()})
	var text []string
	for _, line := range strings.Split(string(prompt), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "!") {
			if line != "" {
				text = append(text, line)
			}
			continue
		}
		verb, arg, _ := strings.Cut(line[1:], " ")
		arg = strings.TrimSpace(arg)
		switch verb {
		case "events":
			n, _ := strconv.Atoi(arg)
			for i := 1; i <= n; i++ {
				a.emit(map[string]any{"type": "message.delta", "index": i, "text": fmt.Sprintf("delta %d of %d", i, n)})
			}
		case "silent", "sleep":
			d, err := time.ParseDuration(arg)
			if err != nil {
				a.emit(map[string]any{"type": "unknown_directive", "directive": line})
				continue
			}
			if verb == "sleep" {
				a.emit(map[string]any{"type": "status", "text": "sleeping " + d.String()})
			}
			time.Sleep(d)
		case "await":
			if !filepath.IsLocal(arg) {
				a.emit(map[string]any{"type": "unknown_directive", "directive": line})
				continue
			}
			a.emit(map[string]any{"type": "status", "text": "awaiting " + arg})
			for {
				if _, err := os.Stat(filepath.Join(dir, arg)); err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		case "exit":
			n, _ := strconv.Atoi(arg)
			return ending{code: n}
		case "crash":
			return ending{crash: true}
		case "hog":
			a.emit(map[string]any{"type": "status", "text": "allocating until killed"})
			hog()
		case "forkbomb":
			n, err := forkbomb()
			a.emit(map[string]any{"type": "status", "text": fmt.Sprintf("started %d copies; then: %v", n, err)})
			return ending{code: 1}
		case "ignoreterm":
			signal.Ignore(syscall.SIGTERM)
			a.emit(map[string]any{"type": "status", "text": "ignoring SIGTERM"})
		case "escape":
			pid, err := escape()
			if err != nil {
				a.emit(map[string]any{"type": "status", "text": "escape failed: " + err.Error()})
				return ending{code: 1}
			}
			a.emit(map[string]any{"type": "status", "text": "escaped", "pid": pid})
		case "fill":
			path := arg
			if !filepath.IsAbs(path) {
				path = filepath.Join(dir, path)
			}
			n, err := fill(path)
			a.emit(map[string]any{"type": "status", "text": fmt.Sprintf("wrote %d bytes; then: %v", n, err)})
			return ending{code: 1}
		case "hang":
			a.emit(map[string]any{"type": "status", "text": "hanging"})
			return ending{hang: true}
		default:
			a.emit(map[string]any{"type": "unknown_directive", "directive": line})
		}
	}
	if len(text) > 0 {
		a.emit(map[string]any{"type": "message", "text": "echo: " + strings.Join(text, " ")})
	}
	a.emit(map[string]any{"type": "turn.completed"})
	if a.err != nil {
		return ending{code: 1}
	}
	return ending{}
}

// hog allocates memory and touches every page of it, for ever: only the
// OOM killer ends it.
func hog() {
	var kept [][]byte
	for {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		kept = append(kept, b)
	}
}

// forkbomb starts idle copies of this executable, in its process group,
// until one cannot be started, and returns how many were.
func forkbomb() (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	for n := 0; ; n++ {
		p, err := os.StartProcess(exe, []string{exe, "--idle"}, &os.ProcAttr{Files: []*os.File{nil, nil, nil}})
		if err != nil {
			return n, err
		}
		_ = p.Release()
	}
}

// escape starts an idle copy of this executable in a new session and
// leaves it running.
func escape() (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	p, err := os.StartProcess(exe, []string{exe, "--idle"}, &os.ProcAttr{
		Files: []*os.File{nil, nil, nil},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	_ = p.Release()
	return pid, nil
}

// fill writes path until a write fails, and returns how much it wrote.
func fill(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return n, err
		}
	}
}

// advance records the prompt in the transcript and moves the native turn
// ordinal on by one, durably, before the turn does anything else.
func advance(sessionDir, prompt string) (int64, error) {
	if err := os.MkdirAll(sessionDir, 0o755); err != nil {
		return 0, err
	}
	var last int64
	b, err := os.ReadFile(filepath.Join(sessionDir, "turn"))
	switch {
	case err == nil:
		if last, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return 0, fmt.Errorf("turn file: %w", err)
		}
	case !os.IsNotExist(err):
		return 0, err
	}
	turn := last + 1
	entry, _ := json.Marshal(map[string]any{"turn": turn, "prompt": prompt})
	f, err := os.OpenFile(filepath.Join(sessionDir, "transcript.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	if _, err := f.Write(append(entry, '\n')); err != nil {
		f.Close()
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	tmp := filepath.Join(sessionDir, "turn.tmp")
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(turn, 10)+"\n"), 0o644); err != nil {
		return 0, err
	}
	return turn, os.Rename(tmp, filepath.Join(sessionDir, "turn"))
}
