package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/sandbox"
)

// LabelInstance carries the random id the container's supervisor was
// started with (`runnerd supervise --id`). Ensure checks that the
// supervisor answering on the socket reports it, so a stale socket or a
// socket of another container can never pass for this one.
const LabelInstance = "runnerd.instance"

// Errors of Ensure beyond the sandbox package's sentinels.
var (
	// ErrSandboxGone: the container died or vanished (mid-turn, it fails
	// the turn closed, R35).
	ErrSandboxGone = errors.New("the conversation's container is gone")
)

// Backend is the Docker sandbox backend. It keeps no state of its own in
// memory: every call finds the conversation's objects again by labels, so
// a fresh Backend after a daemon restart sees what the last one made.
type Backend struct {
	cfg Config
}

var (
	_ sandbox.Backend = (*Backend)(nil)
	_ sandbox.Stopper = (*Backend)(nil)
)

// New checks cfg and returns the backend. It does not talk to the engine.
func New(cfg Config) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Backend{cfg: cfg}, nil
}

// Name is sandbox.BackendDocker.
func (b *Backend) Name() string { return sandbox.BackendDocker }

// Ensure finds the conversation's container or creates it over the
// conversation's workspace volume, starts it if it is stopped, and returns
// once its supervisor answers. Ensure calls for one conversation are
// serialised across processes by a lock file.
func (b *Backend) Ensure(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := validSpec(spec); err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure docker sandbox: %w", err)
	}
	unlock, err := b.lock(ctx, spec.ConversationID)
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure docker sandbox: %w", err)
	}
	defer unlock()
	sb, err := b.ensure(ctx, spec)
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("ensure docker sandbox: %w", err)
	}
	return sb, nil
}

func (b *Backend) ensure(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	conv := spec.ConversationID
	found, ok, err := b.findContainer(ctx, conv)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if ok {
		info, err := b.cfg.Engine.ContainerInspect(ctx, found.ID)
		if err != nil && !cerrdefs.IsNotFound(err) {
			return sandbox.Sandbox{}, fmt.Errorf("inspect container: %w", err)
		}
		legacy := false
		if err == nil && !hasStateMount(info) {
			// Made by the previous release, whose supervisor kept its state
			// in the workspace: replace it, over the same volume, once its
			// state can be moved out (the volume is reachable from here).
			_, legacy, err = b.volumePath(ctx, workspaceVolume(info, b.cfg.Workspace))
			if err != nil {
				return sandbox.Sandbox{}, err
			}
		}
		switch {
		case err == nil && info.State != nil && info.State.Dead:
			// The engine could not stop or remove it cleanly; it will never
			// run again. Remove it and make a new one over the workspace.
			if err := b.removeContainer(ctx, info.ID); err != nil {
				return sandbox.Sandbox{}, err
			}
		case legacy:
			if err := b.removeContainer(ctx, info.ID); err != nil {
				return sandbox.Sandbox{}, err
			}
			recordContainer(b.cfg.Logger, RecordContainerReplaced, conv, info.ID)
		case err == nil:
			return b.reuse(ctx, info)
		}
		// Removed (or dead and removed) since the list: make it anew below.
	}

	vol, found2, err := b.findVolume(ctx, conv)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if !found2 && spec.RecordedID != "" {
		return sandbox.Sandbox{}, sandbox.ErrWorkspaceLost
	}
	// The image is needed only now, to create the container, and before a
	// workspace volume is made for it; a retained container keeps its own,
	// whatever the registry says since (S4: an image that cannot be had
	// fails this turn, the conversation's fault).
	pulled, err := b.image(ctx, spec.Image)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if !found2 {
		vol, _, err = b.ensureVolume(ctx, conv, spec.Cluster)
		if err != nil {
			return sandbox.Sandbox{}, err
		}
	}
	instance, err := newInstanceID()
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	id, err := b.createContainer(ctx, conv, spec.Image, vol, instance, spec.Cluster, spec.Limits)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	recordCreated(b.cfg.Logger, conv, id)
	if err := b.handWorkspace(ctx, id, vol); err != nil {
		// Never started, so nothing of the session is in it: remove it,
		// so that the next Ensure does not start it unprepared.
		return sandbox.Sandbox{}, errors.Join(err, b.removeContainer(ctx, id))
	}
	sst, err := b.start(ctx, conv, id, instance)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	return sandbox.Sandbox{Backend: sandbox.BackendDocker, ID: id, Socket: b.SocketPath(conv), Created: true, Version: sst.Version, Pulled: pulled}, nil
}

// reuse returns a found container, starting it first if it stopped.
func (b *Backend) reuse(ctx context.Context, info container.InspectResponse) (sandbox.Sandbox, error) {
	conv := info.Config.Labels[LabelConversation]
	instance := info.Config.Labels[LabelInstance]
	sb := sandbox.Sandbox{Backend: sandbox.BackendDocker, ID: info.ID, Socket: b.SocketPath(conv)}
	st := info.State
	switch {
	case st == nil:
		return sandbox.Sandbox{}, fmt.Errorf("container %.12s has no state", info.ID)
	case st.Running && !st.Paused && !st.Restarting:
		sst, err := b.waitSupervisor(ctx, info.ID, instance, b.cfg.ProbeTimeout)
		if ctx.Err() != nil {
			return sandbox.Sandbox{}, ctx.Err()
		}
		reason := "supervisor_unresponsive"
		switch {
		case err == nil && sst.Version < sandbox.ProtocolVersion && !sst.Busy && b.mountsOurRunnerd(info):
			// An earlier release's supervisor, idle: restarting the
			// container runs this build's over the same container,
			// workspace and state (a bind mount is made anew from the
			// path, which the upgrade replaced). Its in-memory receipts
			// go (R28), its recorded boundary stays.
			reason = "outdated_protocol"
		case err == nil:
			// Current, or older and busy (the next activation fences its
			// agent) or mounting another binary than ours: used at its
			// own version.
			if sst.Version < sandbox.ProtocolVersion {
				recordOutdatedKept(b.cfg.Logger, conv, info.ID, sst.Version, sst.Busy)
			}
			sb.Version = sst.Version
			return sb, nil
		}
		// Running, but no supervisor of this container answers on the
		// socket: take it for hung and restart the container over the
		// same workspace. The agent it may still run is stopped with it;
		// its receipts are gone (R28), so nothing unconfirmed passes.
		if err := b.prepareRunDir(conv); err != nil {
			return sandbox.Sandbox{}, err
		}
		secs := int(b.cfg.StopTimeout.Seconds())
		if err := b.cfg.Engine.ContainerRestart(ctx, info.ID, container.StopOptions{Timeout: &secs}); err != nil {
			return sandbox.Sandbox{}, fmt.Errorf("restart container (%s): %w", reason, err)
		}
		recordRestarted(b.cfg.Logger, conv, info.ID, reason)
		sst, err = b.waitSupervisor(ctx, info.ID, instance, b.cfg.StartTimeout)
		if err != nil {
			return sandbox.Sandbox{}, err
		}
		sb.Version, sb.Created = sst.Version, true
		return sb, nil
	case st.Status == container.StateCreated || st.Status == container.StateExited:
		// Stopped (a host reboot, the supervisor exited): start it again
		// over the same workspace. Its receipts are gone (R28).
		if err := b.prepareRunDir(conv); err != nil {
			return sandbox.Sandbox{}, err
		}
		if st.Status == container.StateCreated {
			// Never started: an earlier Ensure stopped between create
			// and start, perhaps before the workspace hand-over.
			if err := b.handWorkspace(ctx, info.ID, workspaceVolume(info, b.cfg.Workspace)); err != nil {
				return sandbox.Sandbox{}, err
			}
		}
		sst, err := b.start(ctx, conv, info.ID, instance)
		if err != nil {
			return sandbox.Sandbox{}, err
		}
		sb.Version, sb.Created = sst.Version, true
		return sb, nil
	}
	return sandbox.Sandbox{}, fmt.Errorf("container %.12s is %s: %w", info.ID, st.Status, ErrSandboxGone)
}

// start starts a created or stopped container and waits for its supervisor.
func (b *Backend) start(ctx context.Context, conv, id, instance string) (sandbox.Status, error) {
	if err := b.cfg.Engine.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return sandbox.Status{}, fmt.Errorf("start container: %w", err)
	}
	recordStarted(b.cfg.Logger, conv, id)
	return b.waitSupervisor(ctx, id, instance, b.cfg.StartTimeout)
}

// mountsOurRunnerd: the container's supervisor binary is bind-mounted from
// RunnerdPath, so a restart runs the binary now at that path.
func (b *Backend) mountsOurRunnerd(info container.InspectResponse) bool {
	for _, m := range info.Mounts {
		if m.Type == "bind" && m.Destination == containerRunnerd {
			return m.Source == b.cfg.RunnerdPath
		}
	}
	return false
}

// waitSupervisor waits, up to timeout, until the supervisor of container
// id answers with the container's instance id on the conversation's
// private socket link (see adoptSocket), and returns its status. It gives
// up early if the container stops.
func (b *Backend) waitSupervisor(ctx context.Context, id, instance string, timeout time.Duration) (sandbox.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	info, err := b.cfg.Engine.ContainerInspect(ctx, id)
	if err != nil {
		return sandbox.Status{}, fmt.Errorf("inspect container: %w", err)
	}
	conv := info.Config.Labels[LabelConversation]
	c := &sandbox.Client{Socket: b.SocketPath(conv)}
	delay := 10 * time.Millisecond
	for {
		st, err := c.Status(ctx)
		if err == nil && st.ID == instance {
			return st, nil
		}
		if ctx.Err() != nil {
			return sandbox.Status{}, fmt.Errorf("wait for the supervisor of container %.12s: %w", id, errors.Join(sandbox.ErrUnavailable, ctx.Err()))
		}
		if err == nil || errors.Is(err, sandbox.ErrUnavailable) {
			// Nothing, or the wrong supervisor, behind the private link:
			// link the socket the container's supervisor bound (once it
			// has) and ask again.
			_ = b.adoptSocket(conv)
		}
		// A container that stopped will not answer: say so now.
		info, ierr := b.cfg.Engine.ContainerInspect(ctx, id)
		if cerrdefs.IsNotFound(ierr) {
			return sandbox.Status{}, fmt.Errorf("container %.12s vanished before its supervisor answered: %w", id, ErrSandboxGone)
		}
		if ierr == nil && info.State != nil && !info.State.Running {
			return sandbox.Status{}, fmt.Errorf("container %.12s exited with status %d before its supervisor answered (see its engine log): %w",
				id, info.State.ExitCode, ErrSandboxGone)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// Alive reports whether the sandbox sb (from Ensure) is still there and
// running: nil if so, an error wrapping ErrSandboxGone if its container
// stopped, died or vanished, another error if the engine cannot tell. After
// a turn's stream broke (sandbox.ErrInterrupted) it tells a lost container
// (R35: the turn fails closed) from a dropped connection.
func (b *Backend) Alive(ctx context.Context, sb sandbox.Sandbox) error {
	info, err := b.cfg.Engine.ContainerInspect(ctx, sb.ID)
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("container %.12s: %w", sb.ID, ErrSandboxGone)
	}
	if err != nil {
		return fmt.Errorf("inspect container: %w", err)
	}
	if info.Config == nil || !b.ours(info.Config.Labels) {
		return fmt.Errorf("container %.12s is not this host's", sb.ID)
	}
	if info.State == nil || !info.State.Running || info.State.Restarting {
		status := "unknown"
		if info.State != nil {
			status = info.State.Status
		}
		return fmt.Errorf("container %.12s is %s: %w", sb.ID, status, ErrSandboxGone)
	}
	return nil
}

// Stop stops the conversation's running container (SIGTERM to its
// supervisor, which ends its agent; SIGKILL after StopTimeout) and keeps
// it: its writable layer, its workspace volume and the supervisor's state
// directory stay, and the next Ensure starts the same container again
// (sandbox.Stopper). idle is asked under the conversation's lock, after
// the container was found running; a supervisor that reports a turn
// running is left alone (sandbox.ErrBusy). The stop is proven by the
// engine's inspect (State.Running false) within TeardownBudget of its
// request; otherwise Stop returns true and a *sandbox.TeardownIncomplete
// naming the container (S6).
func (b *Backend) Stop(ctx context.Context, conversationID string, idle func() bool) (bool, error) {
	if conversationID == "" {
		return false, errors.New("stop docker sandbox: empty conversation id")
	}
	unlock, err := b.lock(ctx, conversationID)
	if err != nil {
		return false, fmt.Errorf("stop docker sandbox: %w", err)
	}
	defer unlock()
	found, ok, err := b.findContainer(ctx, conversationID)
	if err != nil || !ok {
		return false, err
	}
	info, err := b.cfg.Engine.ContainerInspect(ctx, found.ID)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stop docker sandbox: inspect container: %w", err)
	}
	if info.State == nil || !info.State.Running || !idle() {
		return false, nil
	}
	pctx, cancel := context.WithTimeout(ctx, b.cfg.ProbeTimeout)
	st, err := (&sandbox.Client{Socket: b.SocketPath(conversationID)}).Status(pctx)
	cancel()
	if err == nil && st.Busy {
		return false, fmt.Errorf("stop docker sandbox: %w", sandbox.ErrBusy)
	}
	if err == nil && st.Unloadable {
		return false, fmt.Errorf("stop docker sandbox: its agent's session lives only in the running agent: %w", sandbox.ErrSessionNotLoadable)
	}
	secs := int(b.cfg.StopTimeout.Seconds())
	bctx, cancel := context.WithTimeout(ctx, b.cfg.TeardownBudget)
	stopErr := b.cfg.Engine.ContainerStop(bctx, info.ID, container.StopOptions{Timeout: &secs})
	over := bctx.Err() != nil
	cancel()
	if stopErr != nil && !over && !cerrdefs.IsNotFound(stopErr) {
		// The engine refused or failed the stop within the budget: nothing
		// was stopped, the sandbox stays idle and is tried again.
		return false, fmt.Errorf("stop docker sandbox: stop container: %w", stopErr)
	}
	if torn := b.proveTornDown(ctx, info.ID, false, stopErr); torn != nil {
		return true, fmt.Errorf("stop docker sandbox: %w", torn)
	}
	recordContainer(b.cfg.Logger, RecordContainerStopped, conversationID, info.ID)
	return true, nil
}

// proveTornDown asks the engine, with a probe of its own (the budget's
// context may be over), whether container id is stopped (removed false)
// or gone (removed true), and returns what names it if not. cause is the
// stop's or removal's failure, if it failed.
func (b *Backend) proveTornDown(ctx context.Context, id string, removed bool, cause error) *sandbox.TeardownIncomplete {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.ProbeTimeout)
	defer cancel()
	info, err := b.cfg.Engine.ContainerInspect(pctx, id)
	switch {
	case cerrdefs.IsNotFound(err):
		return nil
	case err == nil && !removed && info.State != nil && !info.State.Running:
		return nil
	case cause == nil && err != nil:
		cause = fmt.Errorf("inspect container: %w", err)
	case cause == nil && removed:
		cause = errors.New("the engine still lists it")
	case cause == nil:
		cause = errors.New("the engine reports it running")
	}
	return &sandbox.TeardownIncomplete{Container: id, Budget: b.cfg.TeardownBudget, Err: cause}
}

// Remove stops and removes the conversation's container and its workspace
// volume, and deletes its host directory. Only this host's objects are
// touched; what is not there is not an error. A container the engine still
// lists TeardownBudget after its stop was asked is a
// *sandbox.TeardownIncomplete naming it (S6); its volume and directory are
// then kept for the next sweep.
func (b *Backend) Remove(ctx context.Context, conversationID string) error {
	if conversationID == "" {
		return errors.New("remove docker sandbox: empty conversation id")
	}
	unlock, err := b.lock(ctx, conversationID)
	if err != nil {
		return fmt.Errorf("remove docker sandbox: %w", err)
	}
	defer unlock()
	if err := b.remove(ctx, conversationID); err != nil {
		return fmt.Errorf("remove docker sandbox: %w", err)
	}
	return nil
}

func (b *Backend) remove(ctx context.Context, conv string) error {
	list, err := b.cfg.Engine.ContainerList(ctx, container.ListOptions{All: true, Filters: b.filter(conv, roleSandbox)})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	// Each removal is proven by the engine answering that the container
	// is not found, within TeardownBudget of the first stop's request (S6).
	bctx, cancel := context.WithTimeout(ctx, b.cfg.TeardownBudget)
	defer cancel()
	for _, c := range list {
		if !b.ours(c.Labels) || c.Labels[LabelConversation] != conv {
			continue
		}
		err := b.removeContainer(bctx, c.ID)
		if err != nil && bctx.Err() == nil {
			return err // the engine failed the removal within the budget: kept, swept again
		}
		if torn := b.proveTornDown(ctx, c.ID, true, err); torn != nil {
			return torn
		}
	}
	for {
		name, ok, err := b.findVolume(ctx, conv)
		if errors.Is(err, ErrAmbiguous) {
			return err
		}
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := b.removeVolume(ctx, name); err != nil {
			return err
		}
	}
	// The lock file lives in the directory; unlinking it while we hold it
	// is fine: a waiter that then locks the old inode re-checks below.
	if err := os.RemoveAll(b.convDir(conv)); err != nil {
		return fmt.Errorf("remove conversation directory: %w", err)
	}
	return nil
}

// lock takes the conversation's cross-process lock (flock on a file in its
// directory), waiting at most until ctx ends.
func (b *Backend) lock(ctx context.Context, conv string) (func(), error) {
	if err := ensureDir(filepath.Join(b.cfg.StateDir, "docker"), 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := ensureDir(b.convDir(conv), 0o700); err != nil {
		return nil, fmt.Errorf("conversation directory: %w", err)
	}
	path := filepath.Join(b.convDir(conv), "lock")
	delay := 5 * time.Millisecond
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock: %w", err)
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// A Remove may have unlinked the file while we waited: then
			// this lock guards nothing, take the new file's.
			fi, serr := os.Stat(path)
			held, _ := f.Stat()
			if serr == nil && os.SameFile(fi, held) {
				return func() { _ = f.Close() }, nil
			}
			_ = f.Close()
			if err := ensureDir(b.convDir(conv), 0o700); err != nil {
				return nil, fmt.Errorf("conversation directory: %w", err)
			}
			continue
		}
		_ = f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock: %w", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("wait for the conversation lock: %w", ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// workspaceVolume is the name of the volume mounted at the workspace.
func workspaceVolume(info container.InspectResponse, workspace string) string {
	for _, m := range info.Mounts {
		if m.Type == "volume" && m.Destination == workspace {
			return m.Name
		}
	}
	return ""
}

func validSpec(spec sandbox.Spec) error {
	if spec.ConversationID == "" {
		return errors.New("empty conversation id")
	}
	if spec.Image == "" {
		return errors.New("empty image")
	}
	return nil
}

func newInstanceID() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
