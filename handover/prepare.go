package handover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Prepared is a child started before its payload: the process exists, its
// runtime starts and it waits on its descriptor. The daemon starts it before
// it flushes the claim's record and hands it the payload after (Launch), so
// that the child's exec and start overlap the flush instead of following
// it. Until the payload it has been given nothing and can have
// accepted nothing: closed (Close) or dead, it leaves no turn behind, and
// the record still comes before anything that can act on the claim (P5).
// A Prepared is used once, by one goroutine: Launch or Close.
type Prepared struct {
	t *Turn
}

// Prepare starts the child of cfg, which waits for its payload. The error
// is a *NotAccepted (spawn failed) whose Release allows the claim back, as
// Launch's would.
func Prepare(cfg Config) (*Prepared, error) {
	t, err := spawn(cfg.withDefaults())
	if err != nil {
		return nil, err
	}
	return &Prepared{t: t}, nil
}

// Launch is the package's Launch for the prepared child: Config.Started,
// the payload, the answer, with the same results; the execution timeout
// counts from now.
func (c *Prepared) Launch(ctx context.Context, p Payload) (*Turn, error) {
	body, err := encodePayload(p)
	if err != nil {
		c.Close()
		return nil, &NotAccepted{Outcome: OutcomePayloadUndelivered, Class: ClassPayloadInvalid, Err: err}
	}
	return c.launch(ctx, p.Echo, body)
}

// launch runs Config.Started, then supervises the child from its payload
// on and waits for its answer.
func (c *Prepared) launch(ctx context.Context, echo Echo, body []byte) (*Turn, error) {
	t := c.t
	t.echo = echo // nothing reads it before supervise starts
	if t.cfg.Started != nil {
		t.cfg.Started(t.pid)
	}
	go t.supervise(ctx, body)
	<-t.answered
	if t.notAccepted != nil {
		return nil, t.notAccepted
	}
	return t, nil
}

// Close ends a prepared child that will get no payload: its descriptor
// closes, so it exits at its EOF having accepted nothing; one still there
// KillGrace later is sent SIGTERM, and SIGKILL KillGrace after that. It
// returns once the child is reaped and its re-attach socket removed.
func (c *Prepared) Close() {
	t := c.t
	t.conn.Close()
	t.pidfd.SetReadDeadline(time.Now().Add(t.cfg.KillGrace))
	if awaitExited(t.pidfd) != nil { // still there
		t.pidfd.SetReadDeadline(time.Time{})
		t.kill()
		_ = awaitExited(t.pidfd)
	}
	t.reap()
	if t.cfg.Reattach != "" {
		_ = os.Remove(t.cfg.Reattach)
	}
}

// Discard ends a prepared child that will get no payload at once: its
// descriptor closes and it is sent SIGKILL, since a child that was handed
// nothing has accepted nothing (R33) and needs no grace. A spare is
// discarded so: nothing of a daemon's stop or of a claim waits for it. It
// returns once the child is reaped and its re-attach socket removed.
func (c *Prepared) Discard() {
	t := c.t
	t.conn.Close()
	t.signal(unix.SIGKILL)
	_ = awaitExited(t.pidfd)
	t.reap()
	if t.cfg.Reattach != "" {
		_ = os.Remove(t.cfg.Reattach)
	}
}

// PID is the prepared child's process id.
func (c *Prepared) PID() int { return c.t.pid }

// Exited reports, without waiting, whether the prepared child has exited
// (its pidfd is readable). A spare found exited was handed nothing: Close
// reaps it and no claim is concerned (R33).
func (c *Prepared) Exited() bool {
	rc, err := c.t.pidfd.SyscallConn()
	if err != nil {
		return true
	}
	exited := true
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		exited = err != nil || n > 0
	})
	return exited
}

// Assign gives a child prepared before its claim was known (a spare) the
// turn's configuration: everything of cfg but what the process was
// started with (Path, Args, Env, Dir, Stdout, Stderr and KillGrace, which
// stay the prepared ones). Its re-attach socket moves to cfg.Reattach
// (a rename in the same directory: the child holds the listening
// descriptor, so the new path reaches it). The child still has been given
// nothing. An error leaves it as it was, to be closed: a child prepared
// with a re-attach socket cannot be made one without, nor the reverse.
func (c *Prepared) Assign(cfg Config) error {
	t := c.t
	if (cfg.Reattach == "") != (t.cfg.Reattach == "") {
		return errors.New("handover: prepared child and turn disagree on a re-attach socket")
	}
	if cfg.Reattach != t.cfg.Reattach {
		if err := os.Rename(t.cfg.Reattach, cfg.Reattach); err != nil {
			return fmt.Errorf("handover: move the re-attach socket: %w", err)
		}
	}
	cfg = cfg.withDefaults()
	cfg.Path, cfg.Args, cfg.Env, cfg.Dir = t.cfg.Path, t.cfg.Args, t.cfg.Env, t.cfg.Dir
	cfg.Stdout, cfg.Stderr, cfg.KillGrace = t.cfg.Stdout, t.cfg.Stderr, t.cfg.KillGrace
	t.cfg = cfg
	return nil
}
