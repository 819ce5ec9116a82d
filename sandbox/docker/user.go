package docker

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	cerrdefs "github.com/containerd/errdefs"
)

// A fresh workspace volume belongs to root unless the image has a
// directory at the mount point for the engine to copy from. A supervisor
// running as the image's non-root user could not write to it, so before
// the container's first start the backend hands the volume's root
// directory to that user. User and group names are resolved from the
// image's own /etc/passwd and /etc/group (read through the engine), as the
// engine resolves them when it starts the container.
//
// The chown itself is done on the host, at the volume's mount point as the
// engine reports it: the engine's copy API cannot set an owner (20.10
// resolves the container's user in the host's passwd database instead).
// That needs the daemon to run as root beside a local engine, the
// production set-up. Where the mount point is not reachable (a remote or
// rootless engine) nothing is changed: the image must then own its
// workspace directory, or the supervisor fails to start and Ensure says so.

// handWorkspace gives the root of workspace volume vol to the user the
// agents of the created (not yet started) container id run as, if that
// user is not root and the directory still belongs to root.
func (b *Backend) handWorkspace(ctx context.Context, id, vol string) error {
	info, err := b.cfg.Engine.ContainerInspect(ctx, id)
	if err != nil {
		return fmt.Errorf("inspect container: %w", err)
	}
	agent, ok := info.Config.Labels[LabelAgentUser]
	if !ok {
		agent = info.Config.User
	}
	uid, gid, err := b.resolveUser(ctx, id, agent)
	if err != nil {
		return fmt.Errorf("resolve the agents' user %q: %w", agent, err)
	}
	if uid == 0 || vol == "" {
		return nil
	}
	mp, ok, err := b.volumePath(ctx, vol)
	if err != nil || !ok {
		return err // nil when not reachable from here: see above
	}
	fi, err := os.Lstat(mp)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid != 0 {
		return nil // the image's own directory was copied in: keep its owner
	}
	if err := os.Lchown(mp, uid, gid); err != nil {
		return fmt.Errorf("hand the workspace volume to uid %d: %w", uid, err)
	}
	return nil
}

// resolveUser turns a container user spec ("", "name", "uid", "name:group",
// "uid:gid") into numbers the way the engine does: names from the image's
// /etc/passwd and /etc/group; without a group, the user's primary group
// from /etc/passwd, else 0.
func (b *Backend) resolveUser(ctx context.Context, id, spec string) (uid, gid int, err error) {
	if spec == "" {
		return 0, 0, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	primary := -1
	if n, perr := strconv.Atoi(userPart); perr == nil {
		uid = n
	}
	if _, perr := strconv.Atoi(userPart); perr != nil || !hasGroup {
		passwd, err := b.readDB(ctx, id, "/etc/passwd")
		if err != nil {
			return 0, 0, err
		}
		i := slices.IndexFunc(passwd, func(f []string) bool {
			return len(f) >= 4 && (f[0] == userPart || f[2] == userPart)
		})
		switch {
		case i >= 0:
			if uid, err = strconv.Atoi(passwd[i][2]); err != nil {
				return 0, 0, fmt.Errorf("bad uid for %s in /etc/passwd", userPart)
			}
			primary, _ = strconv.Atoi(passwd[i][3])
		case perr != nil:
			return 0, 0, fmt.Errorf("user %s is not in the image's /etc/passwd", userPart)
		}
	}
	if !hasGroup {
		return uid, max(primary, 0), nil
	}
	if n, perr := strconv.Atoi(groupPart); perr == nil {
		return uid, n, nil
	}
	groups, err := b.readDB(ctx, id, "/etc/group")
	if err != nil {
		return 0, 0, err
	}
	for _, f := range groups {
		if len(f) >= 3 && f[0] == groupPart {
			if gid, err = strconv.Atoi(f[2]); err != nil {
				return 0, 0, fmt.Errorf("bad gid for %s in /etc/group", groupPart)
			}
			return uid, gid, nil
		}
	}
	return 0, 0, fmt.Errorf("group %s is not in the image's /etc/group", groupPart)
}

// readDB reads a colon-separated database file (passwd, group) of the
// container's image; a missing file reads as empty.
func (b *Backend) readDB(ctx context.Context, id, path string) ([][]string, error) {
	rc, _, err := b.cfg.Engine.CopyFromContainer(ctx, id, path)
	if cerrdefs.IsNotFound(err) {
		return [][]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil, fmt.Errorf("read %s: not a regular file", path)
	}
	const maxDB = 1 << 20
	sc := bufio.NewScanner(io.LimitReader(tr, maxDB))
	var out [][]string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if out == nil {
		out = [][]string{}
	}
	return out, nil
}
