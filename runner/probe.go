package runner

import (
	"context"
	"errors"
	"log/slog"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/sandbox"
)

// backendProber is a sandbox backend that can say, reading only, whether
// this host could start a turn at all (sandbox/docker: the engine answers,
// the network exists). A backend without it is taken as ready.
type backendProber interface {
	Probe(ctx context.Context) error
}

// WithheldSandbox is the claims_withheld class of a host heartbeat while
// the sandbox backend does not answer.
const WithheldSandbox = "sandbox_unavailable"

// backendState is what the daemon knows of its sandbox backend.
type backendState int

const (
	backendUnknown     backendState = iota // not probed yet: no claim, no READY
	backendReady                           // the last probe passed (or there is nothing to probe)
	backendUnavailable                     // the last probe failed: claims withheld
)

// probeLoop probes the backend at once, again after a backoff while it
// fails (the claim backoff's pace), and every host heartbeat interval
// while it passes, so that an engine that goes away stops the claims of
// this host before its turns would be claimed only to be declined. Each
// change is one record and a host heartbeat at once.
func (d *Daemon) probeLoop(ctx context.Context, p backendProber) {
	// While the backend fails, probes pause under the claims' schedule.
	probes := retry.Policy{Name: "probe", Wait: d.cfg.ClaimBackoff, MaxWait: d.cfg.ClaimBackoffMax, Jitter: d.cfg.Jitter}.Backoff()
	for {
		pctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
		err := p.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		d.setBackend(err)
		wait := jitter(d.cfg.HostHeartbeatInterval, d.cfg.Jitter)
		if err != nil {
			wait = probes.NextBackOff()
		} else {
			probes.Reset()
		}
		if !sleep(ctx.Done(), wait) {
			return
		}
	}
}

// setBackend records a probe's result; a change is logged once and told
// to the control plane and the claim loop at once.
func (d *Daemon) setBackend(err error) {
	next := backendReady
	if err != nil {
		next = backendUnavailable
	}
	d.mu.Lock()
	prev := d.backend
	d.backend = next
	d.mu.Unlock()
	if prev == next {
		return
	}
	switch {
	case next == backendUnavailable:
		class := diagnostics.Class(err)
		var pe *sandbox.PreflightError
		if errors.As(err, &pe) {
			class = pe.Class
		}
		d.log.LogAttrs(context.Background(), slog.LevelError, MsgClaimsWithheld,
			slog.String(keyReason, WithheldSandbox), slog.String(diagnostics.KeyClass, class), slog.String(keyBackend, d.cfg.Sandbox))
	case prev == backendUnavailable:
		d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgClaimsResumed, slog.String(keyBackend, d.cfg.Sandbox))
	}
	d.kick()
}

// kick wakes the host heartbeat and the claim loop.
func (d *Daemon) kick() {
	select {
	case d.kickBeat <- struct{}{}:
	default:
	}
	select {
	case d.slotFreed <- struct{}{}:
	default:
	}
}

func (d *Daemon) backendReady() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.backend == backendReady
}

// claimsWithheld is the host heartbeat's claims_withheld: "" while the
// backend is not known to be unavailable.
func (d *Daemon) claimsWithheld() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.backend == backendUnavailable {
		return WithheldSandbox
	}
	return ""
}
