package runner

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// Two daemons presenting one host token. Every host
// heartbeat and claim names this process's instance (random per start)
// and the machine's boot id (wire.HeaderInstanceID, wire.HeaderBootID).
// The control plane refuses another instance 409 host_token_in_use while
// the one whose heartbeats hold the token is live. A refused daemon does
// not exit: it claims nothing, keeps its turns (they run on their own
// worker tokens) and keeps heartbeating, so that it takes over once the
// other one stops or falls silent past the host's offline bound — a clone
// is seen on Admin → Servers for as long as it runs, and a restart whose
// predecessor is not heard from is never kept down for good.
//
// A restart is never held up: the daemon's last heartbeat when it stops
// says so (wire.HeaderInstanceStopping), releasing the token at once, and
// a handover's new instance shares the old one's boot id, which the
// control plane lets take over at once whatever the old one last said.

// bootIDFile is the kernel's random id of this boot.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// readBootID reads the boot id from path; "" when it cannot.
func readBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	id := strings.TrimSpace(string(b))
	if len(id) > 64 {
		return ""
	}
	return id
}

// instanceHeader is the headers naming the instance on the daemon's calls.
func instanceHeader(instance, bootID string) http.Header {
	h := http.Header{}
	h.Set(wire.HeaderInstanceID, instance)
	if bootID != "" {
		h.Set(wire.HeaderBootID, bootID)
	}
	return h
}

// stoppingClient is c whose calls also say the instance stops.
func stoppingClient(c *wire.Client) *wire.Client {
	s := *c
	s.Header = c.Header.Clone()
	s.Header.Set(wire.HeaderInstanceStopping, "1")
	return &s
}

// isInUse: err is the control plane's 409 host_token_in_use.
func isInUse(err error) bool {
	var se *wire.StatusError
	return errors.As(err, &se) && se.Status == http.StatusConflict && se.Code == wire.CodeHostTokenInUse
}

// markInUse records the refusal (once until a heartbeat is accepted) and
// stops claiming.
func (d *Daemon) markInUse(op string) {
	d.mu.Lock()
	first := !d.inUse
	d.inUse = true
	d.mu.Unlock()
	if first {
		d.log.LogAttrs(context.Background(), slog.LevelError, diagnostics.MsgHostTokenInUse,
			slog.String(diagnostics.KeyOp, op), slog.Int(diagnostics.KeyStatus, http.StatusConflict))
	}
}

// clearInUse: a heartbeat was accepted; claiming may go on.
func (d *Daemon) clearInUse() {
	d.mu.Lock()
	was := d.inUse
	d.inUse = false
	d.mu.Unlock()
	if was {
		d.log.LogAttrs(context.Background(), slog.LevelInfo, diagnostics.MsgHostTokenInUseCleared)
		select {
		case d.slotFreed <- struct{}{}: // the claim loop looks again now
		default:
		}
	}
}

func (d *Daemon) isInUse() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inUse
}
