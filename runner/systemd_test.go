package runner

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// notes is a Notifier that keeps what it was told.
type notes struct {
	mu    sync.Mutex
	sends []string
}

func (n *notes) Notify(state string) error {
	n.mu.Lock()
	n.sends = append(n.sends, state)
	n.mu.Unlock()
	return nil
}

func (n *notes) count(state string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, s := range n.sends {
		if s == state {
			c++
		}
	}
	return c
}

// Style 15: WATCHDOG=1 only while every loop keeps its promise to check in.
// A stuck loop stops the pets (one record); a loop that checks in again
// restores them; a loop stopped on purpose (drain) is never stuck.
func TestWatchdogPetsOnlyWhileLoopsAreLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &notes{}
		logs := &logBuf{}
		d := &Daemon{
			cfg:    Config{Notifier: n, WatchdogInterval: time.Second},
			log:    slog.New(slog.NewJSONHandler(logs, nil)),
			health: newHealth(),
		}
		d.health.expect(loopClaim, 10*time.Second)
		d.health.expect(loopBeat, time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); d.watchdogLoop(ctx) }()

		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		if got := n.count(notifyWatchdog); got != 10 {
			t.Fatalf("%d pets in 10 s of health", got)
		}
		time.Sleep(20 * time.Second) // the claim loop broke its promise
		synctest.Wait()
		if got := n.count(notifyWatchdog); got != 10 {
			t.Fatalf("%d pets while the claim loop was stuck", got)
		}
		if logs.count(MsgWatchdogUnhealthy) != 1 {
			t.Fatalf("want one unhealthy record:\n%s", logs)
		}
		d.health.expect(loopClaim, 5*time.Second)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := n.count(notifyWatchdog); got != 13 {
			t.Fatalf("%d pets after recovery, want 13", got)
		}
		d.health.done(loopClaim)
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := n.count(notifyWatchdog); got != 73 {
			t.Fatalf("%d pets with the claim loop done, want 73", got)
		}
		cancel()
		<-done
	})
}
