package runner

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/handover"
)

// The spare: one turn child started before any claim, its
// socket pair made and waiting on its descriptor, so that a claim hands it
// the payload instead of paying for a fork, an exec and a Go runtime's
// start. The next spare starts after the child's ACCEPT.
//
// R33's proof is unchanged. A spare has been handed nothing until its
// payload (handover.Prepared): one that is found exited when a claim comes
// is reaped and the claim gets a freshly started child instead — no claim
// was ever handed to it, so nothing is released; one that dies after its
// payload and before ACCEPT is handover's "closed without accepting", as
// any child. It is started with the daemon's configuration, which does not
// change while the daemon runs, and its executable: when the file at
// Config.Executable is another one than the spare was started from (an
// upgrade replaced it), the spare is discarded unused. It is no attempt:
// it takes no slot of --capacity and holds no lease.

// Reasons a spare was discarded without a payload (MsgSpareDiscarded,
// runnerd_spare_children_total's end).
const (
	spareExited       = "exited"        // it died (or was killed) while waiting
	spareOutdated     = "outdated"      // the executable changed since it started
	spareAssignFailed = "assign_failed" // it could not be given the turn's configuration
	spareStopped      = "stopped"       // the daemon stopped
	spareHanded       = "handed"        // it got a claim's payload (not a discard)
)

// spareState is the daemon's spare.
type spareState struct {
	mu sync.Mutex // guards the fields below
	// phase: spareNone (none, none starting), spareStarting, spareWaiting
	// (child set), spareClosed (the daemon stopped: no more).
	phase spareCycle
	child *handover.Prepared
	exe   fileID // of Config.Executable when child started
	seq   int    // names the re-attach sockets of successive spares

	// work counts the goroutines that start or close spares, for close.
	work sync.WaitGroup
}

type spareCycle int

const (
	spareNone spareCycle = iota
	spareStarting
	spareWaiting
	spareClosed
)

// fileID identifies an executable file: replacing it (a rename over it,
// as package managers do, or a rewrite) changes it.
type fileID struct {
	dev, ino     uint64
	size, mtimeN int64
}

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtimeN: st.Mtim.Nano()}, nil
}

// spareConfig is how a spare is started: the daemon's executable, turn
// arguments, environment and stderr, and a re-attach socket of its own in
// the state directory, which Assign moves to the attempt's name (a
// daemon that dies before that leaves a socket without a record, which
// the next start removes: sweepTemp).
func (d *Daemon) spareConfig(seq int) handover.Config {
	return handover.Config{
		Path:      d.cfg.Executable,
		Args:      d.cfg.TurnArgs,
		Env:       d.cfg.ChildEnv,
		Stderr:    d.cfg.ChildStderr,
		KillGrace: d.cfg.KillGrace,
		Reattach:  filepath.Join(d.state.root, "attempts", fmt.Sprintf("spare-%d.sock", seq)),
	}
}

// refillSpare starts the next spare unless one waits or starts already,
// or the daemon stopped. It does not wait for the child.
func (d *Daemon) refillSpare() {
	s := &d.spare
	s.mu.Lock()
	if s.phase != spareNone || d.cfg.NoSpare {
		s.mu.Unlock()
		return
	}
	s.phase = spareStarting
	s.seq++
	cfg := d.spareConfig(s.seq)
	s.work.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.work.Done()
		id, err := statID(cfg.Path)
		var p *handover.Prepared
		if err == nil {
			p, err = handover.Prepare(cfg)
		}
		s.mu.Lock()
		if err != nil || s.phase == spareClosed {
			if s.phase == spareStarting {
				s.phase = spareNone // the next ACCEPT tries again
			}
			s.mu.Unlock()
			if err != nil {
				d.log.LogAttrs(context.Background(), slog.LevelWarn, diagnostics.MsgSpareFailed,
					slog.String(diagnostics.KeyClass, spareClass(err)))
			} else {
				d.discardSpare(p, spareStopped)
			}
			return
		}
		s.phase, s.child, s.exe = spareWaiting, p, id
		s.mu.Unlock()
	}()
}

// spareClass is a record class for a spare that could not start.
func spareClass(err error) string {
	if na, ok := err.(*handover.NotAccepted); ok {
		return na.Class
	}
	return "executable"
}

// takeChild is the child for attempt a: the spare when one waits, is
// alive, was started from the executable there now and takes a's
// configuration; otherwise a child started now (handover.Prepare), whose
// error is Prepare's. A spare not taken is discarded: it was handed
// nothing.
func (d *Daemon) takeChild(a *attempt) (*handover.Prepared, error) {
	cfg := d.handoverConfig(a)
	s := &d.spare
	s.mu.Lock()
	p, id := s.child, s.exe
	if s.phase == spareWaiting {
		s.phase, s.child = spareNone, nil
	}
	s.mu.Unlock()
	if p != nil {
		why := spareHanded
		if p.Exited() {
			why = spareExited
		} else if now, err := statID(cfg.Path); err != nil || now != id {
			why = spareOutdated
		} else if err := p.Assign(cfg); err != nil {
			why = spareAssignFailed
		}
		if why == spareHanded {
			d.m.SpareChildren.WithLabelValues(spareHanded).Inc()
			return p, nil
		}
		d.goDiscardSpare(p, why)
	}
	return handover.Prepare(cfg)
}

// goDiscardSpare discards an unused spare on a goroutine of its own:
// Discard waits for the child's reaping, which the claim that found it need
// not.
func (d *Daemon) goDiscardSpare(p *handover.Prepared, why string) {
	d.spare.work.Add(1)
	go func() {
		defer d.spare.work.Done()
		d.discardSpare(p, why)
	}()
}

// discardSpare kills a spare that got no payload (Discard) and records why.
func (d *Daemon) discardSpare(p *handover.Prepared, why string) {
	pid := p.PID()
	p.Discard()
	d.m.SpareChildren.WithLabelValues(why).Inc()
	d.log.LogAttrs(context.Background(), slog.LevelInfo, diagnostics.MsgSpareDiscarded,
		slog.String(diagnostics.KeyReason, why), slog.Int("pid", pid))
}

// spareWaiting reports whether a spare waits now (the metrics' gauge).
func (d *Daemon) spareReady() bool {
	d.spare.mu.Lock()
	defer d.spare.mu.Unlock()
	return d.spare.phase == spareWaiting
}

// closeSpare ends the spare for good, at the daemon's stop (a drain or a
// handover alike: it accepted nothing, so there is nothing to hand over),
// and waits for every spare started or being closed.
func (d *Daemon) closeSpare() {
	s := &d.spare
	s.mu.Lock()
	p := s.child
	s.phase, s.child = spareClosed, nil
	s.mu.Unlock()
	if p != nil {
		d.discardSpare(p, spareStopped)
	}
	s.work.Wait()
}
