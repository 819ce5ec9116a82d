// Command testagent is a tiny static agent for the Docker backend's tests.
//
//	testagent probe   emits one "probe" event describing what the sandbox
//	                  allows it: effective capabilities, no_new_privs, uid,
//	                  whether / is writable, the network interfaces.
//	testagent scribble overwrites every file of the workspace (its working
//	                  directory) with "999", writes 999 where the previous
//	                  release kept the supervisor's native turn
//	                  (.runnerd/native_turn), tries the same in the
//	                  supervisor's state directory and its socket, and
//	                  emits one "scribbled" event saying what it could do.
//	testagent         (anything else) a minimal native session: it counts
//	                  turns in .testagent-turn in the working directory and
//	                  emits {"type":"turn.end","native_turn":N}; a prompt
//	                  containing "!hang" blocks until it is killed;
//	                  one containing "!ignoreterm" ignores SIGTERM.
//
// The tests use the real demo agent (cmd/demoagent) for ordinary turns;
// this one gives them a probe and a hang with a known first event.
package main

import (
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	out := json.NewEncoder(os.Stdout)
	prompt, _ := io.ReadAll(bufio.NewReader(os.Stdin))
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		probe(out)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "scribble" {
		scribble(out)
		return
	}
	b, _ := os.ReadFile(".testagent-turn")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	n++
	if err := os.WriteFile(".testagent-turn", []byte(strconv.FormatInt(n, 10)), 0o644); err != nil {
		_ = out.Encode(map[string]any{"type": "error", "error": err.Error()})
		os.Exit(2)
	}
	if strings.Contains(string(prompt), "!ignoreterm") {
		signal.Ignore(syscall.SIGTERM)
	}
	_ = out.Encode(map[string]any{"type": "turn.start", "native_turn": n})
	if strings.Contains(string(prompt), "!hang") {
		for {
			time.Sleep(time.Hour)
		}
	}
	_ = out.Encode(map[string]any{"type": "turn.end", "native_turn": n})
}

func probe(out *json.Encoder) {
	status, _ := os.ReadFile("/proc/self/status")
	field := func(name string) string {
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	rootWritable := false
	if f, err := os.Create("/probe-write"); err == nil {
		f.Close()
		os.Remove("/probe-write")
		rootWritable = true
	}
	var ifaces []string
	if list, err := net.Interfaces(); err == nil {
		for _, i := range list {
			ifaces = append(ifaces, i.Name)
		}
	}
	_ = out.Encode(map[string]any{
		"type":          "probe",
		"cap_eff":       field("CapEff"),
		"cap_bnd":       field("CapBnd"),
		"no_new_privs":  field("NoNewPrivs"),
		"uid":           os.Getuid(),
		"root_writable": rootWritable,
		"interfaces":    ifaces,
		"pid":           os.Getpid(),
	})
}

func scribble(out *json.Encoder) {
	overwritten := 0
	_ = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && os.WriteFile(path, []byte("999\n"), 0o644) == nil {
			overwritten++
		}
		return nil
	})
	legacy := os.MkdirAll(".runnerd", 0o755) == nil && os.WriteFile(".runnerd/native_turn", []byte("999\n"), 0o644) == nil
	_, listErr := os.ReadDir("/.runnerd/state")
	stateWritable := os.WriteFile("/.runnerd/state/native_turn", []byte("999\n"), 0o644) == nil
	socketReachable := false
	if c, err := net.Dial("unix", "/.runnerd/run/supervisor.sock"); err == nil {
		c.Close()
		socketReachable = true
	}
	_ = out.Encode(map[string]any{
		"type":             "scribbled",
		"overwritten":      overwritten,
		"legacy_written":   legacy,
		"state_listable":   listErr == nil,
		"state_writable":   stateWritable,
		"socket_reachable": socketReachable,
	})
}
