package runner

import (
	"context"
	"log/slog"
	"slices"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/wire"
)

// How a user's cancel reached a turn (record MsgCancelReceived).
const (
	cancelViaRenewal  = "renewal"
	cancelViaHostPoll = "host_poll"
)

// watchCancel adds a's attempt to the host's cancel poll (K10) until the
// returned func is called.
func (d *Daemon) watchCancel(a *attempt) func() {
	d.mu.Lock()
	d.cancelWatch[a.claim.AttemptID] = a
	d.mu.Unlock()
	d.cancelWatchChanged()
	return func() { d.unwatchCancel(a.claim.AttemptID) }
}

func (d *Daemon) unwatchCancel(attemptID string) {
	d.mu.Lock()
	_, ok := d.cancelWatch[attemptID]
	delete(d.cancelWatch, attemptID)
	d.mu.Unlock()
	if ok {
		d.cancelWatchChanged()
	}
}

func (d *Daemon) cancelWatchChanged() {
	select {
	case d.cancelWatchMoved <- struct{}{}:
	default:
	}
}

// cancelWatched is the attempt ids the cancel poll asks about, sorted.
func (d *Daemon) cancelWatched() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.cancelWatch))
	for id := range d.cancelWatch {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids[:min(len(ids), wire.MaxCancelWatch)]
}

// cancelLoop keeps one host-scoped long poll for the user's cancels in
// flight while the daemon holds turns that were not told of one, so that a
// cancel reaches a running turn within about the control plane's poll
// period rather than one renewal interval (K10). A change of the turns held
// asks anew; the answer is a state, so nothing is lost by asking again.
// Failures pause under the claim's schedule; the renewal answer stays the
// fallback (P7) whatever this loop does.
func (d *Daemon) cancelLoop(ctx context.Context) {
	pauses := retry.Policy{Name: "cancels", Wait: d.cfg.ClaimBackoff, MaxWait: d.cfg.ClaimBackoffMax, Jitter: d.cfg.Jitter}.Backoff()
	failures := 0
	for ctx.Err() == nil {
		ids := d.cancelWatched()
		if len(ids) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-d.cancelWatchMoved:
			}
			continue
		}
		pollCtx, stop := context.WithTimeout(ctx, d.cfg.ClaimWait+d.cfg.ControlTimeout)
		type answer struct {
			ids []string
			err error
		}
		got := make(chan answer, 1)
		go func() {
			ids, err := d.control.Cancels(pollCtx, d.hostToken(), wire.CancelsRequest{AttemptIDs: ids, WaitMS: d.cfg.ClaimWait.Milliseconds()})
			got <- answer{ids, err}
		}()
		var ans answer
		select {
		case <-d.cancelWatchMoved:
			stop()
			<-got
			continue
		case ans = <-got:
			stop()
		}
		if ans.err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			pause := pauses.NextBackOff()
			if failures == 1 {
				d.log.LogAttrs(context.Background(), slog.LevelWarn, MsgCancelPollFailed,
					slog.String(diagnostics.KeyClass, diagnostics.Class(ans.err)), slog.Int(diagnostics.KeyStatus, diagnostics.Status(ans.err)),
					slog.Int64(diagnostics.KeyNextDelay, pause.Milliseconds()))
			}
			if !sleep(ctx.Done(), pause) {
				return
			}
			continue
		}
		failures = 0
		pauses.Reset()
		for _, id := range ans.ids {
			d.mu.Lock()
			a := d.cancelWatch[id]
			d.mu.Unlock()
			if a != nil {
				a.cancelFromHost()
			}
		}
	}
}

// cancelFromHost tells the attempt's watch of the user's cancel that the
// host's poll brought. Once.
func (a *attempt) cancelFromHost() {
	a.hostCancelOnce.Do(func() { close(a.hostCancel) })
}
