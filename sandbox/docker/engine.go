package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/runnerd/runnerd/sandbox"
)

// Labels on everything the backend creates. A container or volume is ours
// only if it carries LabelManaged=true and LabelHost equal to Config.Host.
const (
	LabelManaged      = "runnerd.managed"
	LabelHost         = "runnerd.host"
	LabelConversation = "runnerd.conversation"
	LabelRole         = "runnerd.role" // "sandbox" or "workspace"
	// LabelAgentUser is the user the container's agents run as (the
	// supervisor's --agent-user), on containers whose supervisor runs as
	// root; absent when the agents run as the container's own user.
	LabelAgentUser = "runnerd.agent_user"
	// LabelCluster is the cluster identity a sandbox was created under
	// (sandbox.Spec.Cluster), on its workspace volume and its container;
	// absent on objects of an earlier release, or made for a control
	// plane that sent none. Labels never change, so it stays the cluster
	// of the turn that made the object (K8 per sandbox).
	LabelCluster = "runnerd.cluster"
)

const (
	roleSandbox   = "sandbox"
	roleWorkspace = "workspace"
)

// ours reports whether labels mark an object this host created.
func (b *Backend) ours(labels map[string]string) bool {
	return labels[LabelManaged] == "true" && labels[LabelHost] == b.cfg.Host
}

func (b *Backend) labels(conversationID, role string) map[string]string {
	return map[string]string{
		LabelManaged:      "true",
		LabelHost:         b.cfg.Host,
		LabelConversation: conversationID,
		LabelRole:         role,
	}
}

// filter selects this host's objects of a role; with a conversation id,
// only that conversation's.
func (b *Backend) filter(conversationID, role string) filters.Args {
	f := filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelHost+"="+b.cfg.Host),
		filters.Arg("label", LabelRole+"="+role),
	)
	if conversationID != "" {
		f.Add("label", LabelConversation+"="+conversationID)
	}
	return f
}

// slug is a name fragment for the engine and the file system: the readable
// part of the conversation id, then a hash of host and id so that two hosts
// sharing an engine, or two ids that sanitize alike, never collide. Names
// are for people; the backend finds objects by labels.
func (b *Backend) slug(conversationID string) string {
	var s strings.Builder
	for _, r := range conversationID {
		if s.Len() >= 40 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			s.WriteRune(r)
		} else {
			s.WriteByte('_')
		}
	}
	h := sha256.Sum256([]byte(b.cfg.Host + "\x00" + conversationID))
	return s.String() + "-" + hex.EncodeToString(h[:6])
}

func (b *Backend) containerName(conversationID string) string {
	return "runnerd-" + b.slug(conversationID)
}

func (b *Backend) volumeName(conversationID string) string {
	return "runnerd-ws-" + b.slug(conversationID)
}

// convDir is the conversation's host directory; runDir, inside it, is
// bind-mounted at containerSocketDir.
func (b *Backend) convDir(conversationID string) string {
	return filepath.Join(b.cfg.StateDir, "docker", b.slug(conversationID))
}

func (b *Backend) runDir(conversationID string) string {
	return filepath.Join(b.convDir(conversationID), "run")
}

// stateDir, in the conversation's host directory, is bind-mounted at
// containerStateDir for the supervisor's state (the native turn boundary).
// It is 0700 and the host's root's: a container's root may write it, a
// non-root agent cannot even look in.
func (b *Backend) stateDir(conversationID string) string {
	return filepath.Join(b.convDir(conversationID), "state")
}

// hasStateMount reports whether a container has the state directory of
// this release. One without it was made by the previous release, whose
// supervisor kept its state in the workspace.
func hasStateMount(info container.InspectResponse) bool {
	for _, m := range info.Mounts {
		if m.Destination == containerStateDir {
			return true
		}
	}
	return false
}

// isRoot reports whether a container user spec names root, or is empty,
// which the engine takes for root. A name that the image's /etc/passwd maps
// to uid 0 is not caught here: the supervisor refuses it as --agent-user.
func isRoot(spec string) bool {
	u, _, _ := strings.Cut(spec, ":")
	return u == "" || u == "0" || u == "root"
}

// agentUser is the user spec the conversation's agents are to run as:
// Config.User, else the image's own USER.
func (b *Backend) agentUser(ctx context.Context, image string) (string, error) {
	if b.cfg.User != "" {
		return b.cfg.User, nil
	}
	img, err := b.cfg.Engine.ImageInspect(ctx, image)
	if err != nil {
		return "", fmt.Errorf("inspect image: %w", err)
	}
	if img.Config == nil {
		return "", nil
	}
	return img.Config.User, nil
}

// SocketPath is the host path of the conversation's supervisor socket as
// the host dials it (sandbox.Sandbox.Socket): a hard link, in the
// conversation's private directory, to the socket the supervisor bound in
// the shared run directory. See adoptSocket.
func (b *Backend) SocketPath(conversationID string) string {
	return filepath.Join(b.convDir(conversationID), socketName)
}

// boundSocket is where the supervisor binds its socket, seen from the host.
func (b *Backend) boundSocket(conversationID string) string {
	return filepath.Join(b.runDir(conversationID), socketName)
}

// adoptSocket hard-links the socket the supervisor bound into the
// conversation's private directory. The run directory is shared with the
// container, so the agent (the same uid as the supervisor) can put
// anything there — a symlink to another conversation's socket, say. The
// host never dials that path: it dials only a private link made here, to
// an inode checked to be a socket. A symlink swapped in between the check
// and the link is caught by comparing the inodes.
func (b *Backend) adoptSocket(conversationID string) error {
	bound, private := b.boundSocket(conversationID), b.SocketPath(conversationID)
	fi, err := os.Lstat(bound)
	if err != nil {
		return err
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("%s is not a socket", bound)
	}
	tmp := private + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Link(bound, tmp); err != nil { // linkat without AT_SYMLINK_FOLLOW
		return err
	}
	linked, err := os.Lstat(tmp)
	if err != nil || !os.SameFile(fi, linked) || linked.Mode().Type() != os.ModeSocket {
		_ = os.Remove(tmp)
		return fmt.Errorf("%s changed while it was linked", bound)
	}
	return os.Rename(tmp, private)
}

// ErrAmbiguous means the engine holds more than one container of this host
// for one conversation: the backend cannot tell which one is the retained
// sandbox, so it uses neither.
var ErrAmbiguous = errors.New("more than one retained container for the conversation")

// findContainer returns the conversation's container of this host, or
// ok=false when there is none. It only reads.
func (b *Backend) findContainer(ctx context.Context, conversationID string) (container.Summary, bool, error) {
	list, err := b.cfg.Engine.ContainerList(ctx, container.ListOptions{All: true, Filters: b.filter(conversationID, roleSandbox)})
	if err != nil {
		return container.Summary{}, false, fmt.Errorf("list containers: %w", err)
	}
	// The engine filtered by label; check again so that a filter the
	// engine ignored can never hand us someone else's container.
	var mine []container.Summary
	for _, c := range list {
		if b.ours(c.Labels) && c.Labels[LabelConversation] == conversationID {
			mine = append(mine, c)
		}
	}
	switch len(mine) {
	case 0:
		return container.Summary{}, false, nil
	case 1:
		return mine[0], true, nil
	}
	return container.Summary{}, false, ErrAmbiguous
}

// findVolume returns the name of the conversation's workspace volume of
// this host, or ok=false when there is none.
func (b *Backend) findVolume(ctx context.Context, conversationID string) (string, bool, error) {
	resp, err := b.cfg.Engine.VolumeList(ctx, volume.ListOptions{Filters: b.filter(conversationID, roleWorkspace)})
	if err != nil {
		return "", false, fmt.Errorf("list volumes: %w", err)
	}
	var names []string
	for _, v := range resp.Volumes {
		if b.ours(v.Labels) && v.Labels[LabelConversation] == conversationID {
			names = append(names, v.Name)
		}
	}
	switch len(names) {
	case 0:
		return "", false, nil
	case 1:
		return names[0], true, nil
	}
	return "", false, fmt.Errorf("more than one workspace volume for the conversation: %w", ErrAmbiguous)
}

// ensureVolume finds or creates the workspace volume.
func (b *Backend) ensureVolume(ctx context.Context, conversationID, cluster string) (name string, created bool, err error) {
	name, ok, err := b.findVolume(ctx, conversationID)
	if err != nil || ok {
		return name, false, err
	}
	labels := b.labels(conversationID, roleWorkspace)
	if cluster != "" {
		labels[LabelCluster] = cluster
	}
	v, err := b.cfg.Engine.VolumeCreate(ctx, volume.CreateOptions{
		Name:   b.volumeName(conversationID),
		Labels: labels,
	})
	if err != nil {
		return "", false, fmt.Errorf("create workspace volume: %w", err)
	}
	// VolumeCreate answers with an existing volume of that name; refuse
	// one that is not ours rather than mount a stranger's data.
	if !b.ours(v.Labels) || v.Labels[LabelConversation] != conversationID {
		return "", false, fmt.Errorf("volume %s exists and is not this host's workspace for the conversation", v.Name)
	}
	return v.Name, true, nil
}

// containerSpec is what the backend creates: the security defaults of
// Config, the supervisor as the entrypoint, the workspace volume, the
// socket and state directories and the runnerd binary. With a non-root
// agent user the supervisor runs as root with only the capabilities it
// needs to start and stop agents as that user (which keeps none of them).
func (b *Backend) containerSpec(conversationID, image, volumeName, instance, agentUser string, limits sandbox.Limits) (*container.Config, *container.HostConfig) {
	cfg := b.cfg
	labels := b.labels(conversationID, roleSandbox)
	labels[LabelInstance] = instance
	user, capAdd := agentUser, cfg.CapAdd
	argv := b.superviseArgv(instance)
	if !isRoot(agentUser) {
		labels[LabelAgentUser] = agentUser
		user = "0:0"
		capAdd = append(slices.Clip(capAdd), "CAP_SETUID", "CAP_SETGID", "CAP_KILL")
		argv = append(argv, "--agent-user", agentUser)
	}
	cc := &container.Config{
		Image:      image,
		User:       user,
		WorkingDir: cfg.Workspace,
		Entrypoint: argv,
		Cmd:        nil, // the image's CMD is not used once Entrypoint is set
		Labels:     labels,
		// No stdin, no tty: the supervisor speaks only on its socket.
		AttachStdout: false,
		AttachStderr: false,
	}
	hc := &container.HostConfig{
		NetworkMode: container.NetworkMode(cfg.Network),
		CapDrop:     []string{"ALL"},
		CapAdd:      capAdd,
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: cfg.RunnerdPath, Target: containerRunnerd, ReadOnly: true},
			{Type: mount.TypeBind, Source: b.runDir(conversationID), Target: containerSocketDir},
			{Type: mount.TypeBind, Source: b.stateDir(conversationID), Target: containerStateDir},
			{Type: mount.TypeVolume, Source: volumeName, Target: cfg.Workspace},
		},
		ReadonlyRootfs: !cfg.WritableRootFS,
		RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
	}
	if !cfg.AllowNewPrivileges {
		hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
	}
	if !cfg.WritableRootFS {
		hc.Tmpfs = map[string]string{"/tmp": "rw,nosuid,nodev,size=" + strconv.FormatInt(cfg.TmpfsBytes, 10)}
	}
	if !cfg.NoInit {
		yes := true
		hc.Init = &yes
	}
	// Limits: the conversation's limit where it is lower than the host's (or
	// the host sets none), the host's otherwise.
	if n := lower(cfg.PidsLimit, limits.Pids); n > 0 {
		hc.PidsLimit = &n
	}
	if n := lower(cfg.MemoryBytes, limits.MemoryBytes); n > 0 {
		hc.Memory = n
		hc.MemorySwap = n // no swap beyond the limit
	}
	if n := lower(cfg.NanoCPUs, int64(limits.CPUs*1e9)); n > 0 {
		hc.NanoCPUs = n
	}
	if cfg.LogMaxBytes > 0 {
		hc.LogConfig = container.LogConfig{Type: DefaultLogDriver, Config: map[string]string{
			"max-size": strconv.FormatInt(cfg.LogMaxBytes, 10),
			"max-file": strconv.Itoa(cfg.LogMaxFiles),
		}}
	}
	return cc, hc
}

// lower is the limit that applies of a host's (positive: a limit,
// negative: none) and a conversation's (positive: a limit, 0: none of its
// own): the lower of the two limits; 0 or less is none.
func lower(host, conv int64) int64 {
	if conv > 0 && (host <= 0 || conv < host) {
		return conv
	}
	return host
}

// superviseArgv is the container's entrypoint: our supervisor, serving
// its socket in the bind-mounted run directory, over the workspace.
func (b *Backend) superviseArgv(instance string) []string {
	argv := []string{
		containerRunnerd, "supervise",
		"--socket", containerSocketDir + "/" + socketName,
		"--workspace", b.cfg.Workspace,
		"--state", containerStateDir,
		"--id", instance,
	}
	return append(argv, b.cfg.SuperviseArgs...)
}

// createContainer creates (does not start) the conversation's container.
// A native turn boundary the previous release kept in the workspace volume
// moves to the state directory first.
func (b *Backend) createContainer(ctx context.Context, conversationID, image, volumeName, instance, cluster string, limits sandbox.Limits) (string, error) {
	if err := b.prepareRunDir(conversationID); err != nil {
		return "", err
	}
	if err := ensureDir(b.stateDir(conversationID), 0o700); err != nil {
		return "", fmt.Errorf("state directory: %w", err)
	}
	mp, ok, err := b.volumePath(ctx, volumeName)
	if err != nil {
		return "", err
	}
	if ok {
		moved, err := sandbox.AdoptLegacyState(mp, b.stateDir(conversationID))
		if err != nil {
			return "", err
		}
		if moved {
			recordContainer(b.cfg.Logger, RecordStateAdopted, conversationID, "")
		}
	}
	agentUser, err := b.agentUser(ctx, image)
	if err != nil {
		return "", err
	}
	cc, hc := b.containerSpec(conversationID, image, volumeName, instance, agentUser, limits)
	if cluster != "" {
		cc.Labels[LabelCluster] = cluster
	}
	resp, err := b.cfg.Engine.ContainerCreate(ctx, cc, hc, nil, nil, b.containerName(conversationID))
	if err != nil {
		return "", fmt.Errorf("create container: %w", err)
	}
	return resp.ID, nil
}

// prepareRunDir makes the conversation directory (0700, ours) and the run
// directory inside it, and removes the stale socket and private link left
// by an earlier container. The run directory is world-writable so that a supervisor
// running as any non-root uid can bind its socket there; the 0700 parent
// keeps every other host user out.
func (b *Backend) prepareRunDir(conversationID string) error {
	if err := ensureDir(filepath.Join(b.cfg.StateDir, "docker"), 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if err := ensureDir(b.convDir(conversationID), 0o700); err != nil {
		return fmt.Errorf("conversation directory: %w", err)
	}
	if err := ensureDir(b.runDir(conversationID), 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	for _, p := range []string{b.boundSocket(conversationID), b.SocketPath(conversationID)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	}
	return nil
}

// removeContainer stops and removes a container after checking it is ours.
func (b *Backend) removeContainer(ctx context.Context, id string) error {
	info, err := b.cfg.Engine.ContainerInspect(ctx, id)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect container: %w", err)
	}
	if info.Config == nil || !b.ours(info.Config.Labels) {
		return fmt.Errorf("container %.12s is not this host's: refusing to remove it", id)
	}
	if info.State != nil && info.State.Running {
		secs := int(b.cfg.StopTimeout.Seconds())
		if err := b.cfg.Engine.ContainerStop(ctx, id, container.StopOptions{Timeout: &secs}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("stop container: %w", err)
		}
	}
	err = b.cfg.Engine.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove container: %w", err)
	}
	return nil
}

// removeVolume removes a volume after checking it is ours.
func (b *Backend) removeVolume(ctx context.Context, name string) error {
	v, err := b.cfg.Engine.VolumeInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect volume: %w", err)
	}
	if !b.ours(v.Labels) {
		return fmt.Errorf("volume %s is not this host's: refusing to remove it", name)
	}
	if err := b.cfg.Engine.VolumeRemove(ctx, name, false); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove volume: %w", err)
	}
	return nil
}

// volumePath is the host path of a volume's data, when this process can
// reach it (a local engine, the daemon running as root); see user.go.
func (b *Backend) volumePath(ctx context.Context, name string) (string, bool, error) {
	if name == "" {
		return "", false, nil
	}
	v, err := b.cfg.Engine.VolumeInspect(ctx, name)
	if err != nil {
		return "", false, fmt.Errorf("inspect workspace volume: %w", err)
	}
	fi, err := os.Lstat(v.Mountpoint)
	if err != nil || !fi.IsDir() {
		return "", false, nil
	}
	return v.Mountpoint, true, nil
}
