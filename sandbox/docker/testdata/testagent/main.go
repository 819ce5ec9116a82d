// Command testagent is a tiny static agent for the Docker backend's tests.
//
//	testagent probe   emits one "probe" event describing what the sandbox
//	                  allows it: effective capabilities, no_new_privs, uid,
//	                  whether / is writable, the network interfaces.
//	testagent         (anything else) a minimal native session: it counts
//	                  turns in .testagent-turn in the working directory and
//	                  emits {"type":"turn.end","native_turn":N}; a prompt
//	                  containing "!hang" blocks until it is killed.
//
// The tests use the real demo agent (cmd/demoagent) for ordinary turns;
// this one gives them a probe and a hang with a known first event.
package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	out := json.NewEncoder(os.Stdout)
	prompt, _ := io.ReadAll(bufio.NewReader(os.Stdin))
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		probe(out)
		return
	}
	b, _ := os.ReadFile(".testagent-turn")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	n++
	if err := os.WriteFile(".testagent-turn", []byte(strconv.FormatInt(n, 10)), 0o644); err != nil {
		_ = out.Encode(map[string]any{"type": "error", "error": err.Error()})
		os.Exit(2)
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
