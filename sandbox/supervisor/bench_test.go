package supervisor

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/wire"
)

// BenchmarkTurn is one whole turn through a running supervisor: activate,
// run the demo agent (start, prompt, two events, exit), drain, settle.
func BenchmarkTurn(b *testing.B) {
	s := startServe(b)
	ctx := context.Background()
	for b.Loop() {
		act, err := s.c.Activate(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := turn.Next(); err != nil {
				break
			}
		}
		turn.Close()
		if _, err := s.c.Settle(ctx, act.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTurnCost sets a turn over ACP beside a lines turn, both with
// the demo agent (a real process) and the supervisor in this process:
// activate, (ACP: prepare, which finds the kept agent), run "bench" to its
// end, settle. first-event-µs is from the run request to the turn's first
// event (lines: the agent's process is started for it; ACP: the kept
// agent gets a session/prompt); cpu-µs/turn is the CPU of this process
// (supervisor and client) and of the agent: lines' agents are reaped
// (RUSAGE_CHILDREN), the kept ACP agent is read from /proc.
func BenchmarkTurnCost(b *testing.B) {
	for _, proto := range []string{wire.AgentProtocolLines, sandbox.AgentProtocolACP} {
		b.Run(proto, func(b *testing.B) {
			s := startServe(b)
			ctx := context.Background()
			turn := func() (time.Duration, int) {
				act, err := s.c.Activate(ctx, 0)
				if err != nil {
					b.Fatal(err)
				}
				begin := time.Now()
				var t *sandbox.Turn
				pid := 0
				if proto == sandbox.AgentProtocolACP {
					p, err := s.c.Prepare(ctx, act.ID, demoACP())
					if err != nil {
						b.Fatal(err)
					}
					pid = p.PID
					t, err = s.c.RunACP(ctx, act.ID, "bench", sandbox.ACPOptions{})
					if err != nil {
						b.Fatal(err)
					}
				} else {
					t, err = s.c.Run(ctx, act.ID, []string{demoAgent}, "bench")
					if err != nil {
						b.Fatal(err)
					}
				}
				if _, err := t.Next(); err != nil {
					b.Fatal(err)
				}
				first := time.Since(begin)
				for {
					if _, err := t.Next(); err != nil {
						break
					}
				}
				t.Close()
				if _, err := s.c.Settle(ctx, act.ID); err != nil {
					b.Fatal(err)
				}
				return first, pid
			}
			_, pid := turn() // the ACP agent starts and makes its session here, untimed
			cpu0, agent0 := cpuNow(b), procCPU(b, pid)
			var first time.Duration
			n := 0
			for b.Loop() {
				f, _ := turn()
				first += f
				n++
			}
			cpu := cpuNow(b) - cpu0 + procCPU(b, pid) - agent0
			b.ReportMetric(float64(first.Microseconds())/float64(n), "first-event-µs")
			b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/turn")
		})
	}
}

// cpuNow is the CPU time of this process and of its reaped children.
func cpuNow(b *testing.B) time.Duration {
	var self, children unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &self) != nil || unix.Getrusage(unix.RUSAGE_CHILDREN, &children) != nil {
		b.Fatal("getrusage")
	}
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(children.Utime) + tv(children.Stime)
}

// procCPU is the CPU time of the live process pid (0: none), from
// /proc/PID/stat's utime and stime.
func procCPU(b *testing.B, pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime the 13th.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / hz
}
