package runner

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/runnerd/runnerd/internal/atomicfile"
)

// clusterFile holds, in the state directory, the control plane's cluster
// identity as this host pinned it at first contact (K8).
const clusterFile = "cluster-id"

// Why the daemon does not take a control plane's word for a removal.
const (
	clusterNone       = "no_cluster_identity" // the control plane sent none (older than K8)
	clusterChanged    = "cluster_changed"     // not the pinned identity: a new or restored database, another DSN
	clusterUnreadable = "pin_unreadable"      // the pin file could not be read
	clusterUnwritable = "pin_unwritable"      // the first identity seen could not be pinned
)

// pinPhase is what the daemon knows of the pinned identity.
type pinPhase int

const (
	pinUnset      pinPhase = iota // no contact yet: the first identity seen is pinned
	pinSet                        // pinned: only that identity is trusted
	pinUnreadable                 // the file exists but could not be read: nothing is trusted
)

// clusterPin is the pinned cluster identity (K8). A sandbox is removed only
// on a tombstone from the cluster pinned here: a control plane started on
// an empty or restored database, or pointed at the wrong one, has another
// identity, and its word removes nothing.
type clusterPin struct {
	path string

	mu      sync.Mutex // guards phase, id and refused
	phase   pinPhase
	id      string
	refused string // the last refusal recorded (why and identity), so each is recorded once
}

// loadClusterPin reads the pin of an earlier run. A missing file is the
// first contact to come; any other failure trusts nothing, rather than
// keep the daemon from running its turns.
func loadClusterPin(root string) *clusterPin {
	p := &clusterPin{path: filepath.Join(root, clusterFile)}
	b, err := os.ReadFile(p.path)
	id := strings.TrimSpace(string(b))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil || id == "" || strings.ContainsAny(id, " \t\n/"):
		p.phase = pinUnreadable
	default:
		p.phase, p.id = pinSet, id
	}
	return p
}

// check pins id at first contact and reports whether a removal may be
// taken on the word of the control plane that answered with it; why
// says what stands against it.
func (p *clusterPin) check(id string) (pinned string, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case id == "":
		return p.id, clusterNone
	case p.phase == pinUnreadable:
		return "", clusterUnreadable
	case p.phase == pinUnset:
		if err := atomicfile.Write(p.path, []byte(id+"\n"), 0o600); err != nil {
			return "", clusterUnwritable
		}
		p.phase, p.id = pinSet, id
	case id != p.id:
		return p.id, clusterChanged
	}
	return p.id, ""
}

// firstRefusal reports whether this refusal differs from the last one
// recorded, and remembers it.
func (p *clusterPin) firstRefusal(why, id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := why + " " + id
	if p.refused == key {
		return false
	}
	p.refused = key
	return true
}

// trustCluster checks the identity a control plane answered with against
// the pin (pinning it at first contact) and reports whether its word may
// remove a sandbox. A refusal is recorded once, loudly, for each identity.
func (d *Daemon) trustCluster(id string) bool {
	pinned, why := d.cluster.check(id)
	if why == "" {
		return true
	}
	if d.cluster.firstRefusal(why, id) {
		d.log.LogAttrs(context.Background(), slog.LevelError, MsgClusterChanged,
			slog.String(keyDecision, why), slog.String(keyPinnedCluster, pinned), slog.String(keySeenCluster, id),
			slog.String(keyFile, d.cluster.path))
	}
	return false
}
