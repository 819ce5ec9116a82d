package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/runnerd/runnerd/internal/bench/held"
)

// B5: the cost per held turn, measured by package held: a
// real control plane and daemon hold turns silent turns at once, with the
// product's renewal interval; /proc gives the daemon's and the whole
// host's share per turn. What stayed behind after the turns ended (held's
// leak list) is reported beside the figures.
func (b *bench) b5(ctx context.Context) error {
	cfg := held.Config{Bin: b.o.bin, Turns: 100, Window: 15 * time.Second, Progress: b.log}
	if b.o.quick {
		cfg.Turns, cfg.Window, cfg.RenewInterval = 4, 2*time.Second, time.Second
	}
	res, err := held.Run(ctx, cfg)
	if err != nil {
		return err
	}
	left := "nothing left behind"
	if len(res.Leaks) > 0 {
		left = "left behind: " + strings.Join(res.Leaks, "; ")
	}
	n := float64(res.Turns)
	interval := "the product's renewal interval"
	if cfg.RenewInterval > 0 {
		interval = "renewal every " + cfg.RenewInterval.String()
	}
	b.rep.add(row{ID: "B5", What: fmt.Sprintf("per held turn, %d turns: daemon memory", res.Turns), Value: res.DaemonKBPerTurn(), Unit: "KB RSS",
		Detail: fmt.Sprintf("%.2f daemon threads per turn; %.2f ms daemon CPU per turn per minute (%s)",
			res.DaemonThreadsPerTurn(), res.CPUMsPerTurnMinute(res.Daemon), interval)})
	b.rep.add(row{ID: "B5", What: fmt.Sprintf("per held turn, %d turns: whole host (turn child, supervisor, agent)", res.Turns), Value: float64(res.Host.PSSKB) / n, Unit: "KB PSS",
		Detail: fmt.Sprintf("%.2f processes, %.1f threads per turn; %.2f ms CPU per turn per minute; %s",
			float64(res.Host.Processes)/n, float64(res.Host.Threads)/n, res.CPUMsPerTurnMinute(res.Host), left)})
	return nil
}
