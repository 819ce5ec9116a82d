package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/atomicfile"
	"github.com/runnerd/runnerd/wire"
)

// ErrRegistrationRefused is Run's error when the control plane refused
// the registration (an expired, used-up, revoked or unknown registration
// token, a taken name, a label not granted): a retry cannot change it. It
// wraps the answer's *wire.StatusError, whose Message says why.
var ErrRegistrationRefused = errors.New("the control plane refused the registration")

// hostToken is the host token now.
func (d *Daemon) hostToken() string { return *d.hostTok.Load() }

// register buys the host its own token with the registration token and
// stores it in HostTokenFile before using it: a daemon that could not
// keep its token never registers (the file's directory is tried first).
// Transport failures and 5xx are retried with the claim backoff until ctx
// ends; a refusal ends it.
func (d *Daemon) register(ctx context.Context) error {
	path := d.cfg.HostTokenFile
	if err := checkWritable(filepath.Dir(path)); err != nil {
		return fmt.Errorf("the host token could not be stored in %s, so the host was not registered: %w", path, err)
	}
	labels := maps.Clone(d.cfg.Labels)
	for _, k := range []string{wire.LabelSandbox, wire.LabelOS, wire.LabelArch} {
		delete(labels, k) // the daemon's own, sent with each heartbeat
	}
	req := wire.RegisterRequest{Name: d.cfg.HostName, Labels: labels, Version: d.cfg.Version}
	backoff := d.cfg.ClaimBackoff
	for {
		rctx, cancel := context.WithTimeout(ctx, d.cfg.ControlTimeout)
		resp, err := d.control.Register(rctx, d.cfg.RegistrationToken, req)
		cancel()
		if err == nil {
			if err := atomicfile.Write(path, []byte(resp.HostToken+"\n"), 0o600); err != nil {
				return fmt.Errorf("registered as %s, but the host token could not be stored in %s (remove the host and start again): %w", d.cfg.HostName, path, err)
			}
			d.hostTok.Store(&resp.HostToken)
			d.log.LogAttrs(context.Background(), slog.LevelInfo, MsgHostRegistered, slog.String("host_name", d.cfg.HostName), slog.String("file", path))
			return nil
		}
		var se *wire.StatusError
		if errors.As(err, &se) && se.Status < 500 {
			d.log.LogAttrs(context.Background(), slog.LevelError, MsgRegisterFailed, slog.Int(diagnostics.KeyStatus, se.Status),
				slog.String(diagnostics.KeyClass, se.Code))
			return fmt.Errorf("%w: %w", ErrRegistrationRefused, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.rec.ControlFailure(context.Background(), "register", diagnostics.Attempt{}, err)
		t := time.NewTimer(jitter(backoff, d.cfg.Jitter))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, d.cfg.ClaimBackoffMax)
	}
}

// checkWritable creates and removes a file in dir.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, atomicfile.TempPrefix+"probe-")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// adoptHostToken takes a rotated host token from a heartbeat answer: kept
// in HostTokenFile first (atomically, 0600), then used for every call
// from now on. A file that cannot be written leaves the token in memory
// only, and a record saying so: the daemon works on until it restarts
// after the rotation's grace.
func (d *Daemon) adoptHostToken(tok string) {
	if tok == "" || tok == d.hostToken() {
		return
	}
	stored := d.cfg.HostTokenFile != ""
	var class string
	if stored {
		if err := atomicfile.Write(d.cfg.HostTokenFile, []byte(tok+"\n"), 0o600); err != nil {
			stored, class = false, diagnostics.Class(err)
		}
	}
	d.hostTok.Store(&tok)
	level := slog.LevelInfo
	if !stored {
		level = slog.LevelWarn
	}
	d.log.LogAttrs(context.Background(), level, MsgHostTokenRotated, slog.Bool("stored", stored),
		slog.String("file", d.cfg.HostTokenFile), slog.String(diagnostics.KeyClass, class))
}
