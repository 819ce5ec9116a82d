package docker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/volume"

	"github.com/runnerd/runnerd/sandbox"
)

// SweepResult says what one sweep did.
type SweepResult struct {
	// Removed are the conversations whose container and workspace volume
	// this sweep removed.
	Removed []string
	// Kept counts this host's conversations the predicate kept.
	Kept int
}

// Sweep removes the sandboxes — container, workspace volume, host
// directory — of this host's conversations for which remove reports true
// (the runner decides: LOST or deleted conversations). It looks only at
// objects labelled as this host's, takes each conversation's lock like
// Ensure, and leaves a RecordSwept record per removed conversation. A
// failure with one conversation does not stop the others; the errors are
// joined.
func (b *Backend) Sweep(ctx context.Context, remove func(conversationID string) bool) (SweepResult, error) {
	convs, err := b.conversations(ctx)
	if err != nil {
		return SweepResult{}, fmt.Errorf("sweep docker sandboxes: %w", err)
	}
	var res SweepResult
	var errs []error
	for _, conv := range convs {
		if !remove(conv) {
			res.Kept++
			continue
		}
		ids, vols, err := b.sweepOne(ctx, conv)
		if err != nil {
			recordSweepFailed(b.cfg.Logger, conv, errorClass(ctx, err))
			errs = append(errs, fmt.Errorf("sweep conversation %s: %w", conv, err))
			continue
		}
		recordSwept(b.cfg.Logger, conv, ids, vols)
		res.Removed = append(res.Removed, conv)
	}
	return res, errors.Join(errs...)
}

func (b *Backend) sweepOne(ctx context.Context, conv string) (containerID, volumeName string, err error) {
	unlock, err := b.lock(ctx, conv)
	if err != nil {
		return "", "", err
	}
	defer unlock()
	if c, ok, err := b.findContainer(ctx, conv); err == nil && ok {
		containerID = c.ID
	}
	if v, ok, err := b.findVolume(ctx, conv); err == nil && ok {
		volumeName = v
	}
	return containerID, volumeName, b.remove(ctx, conv)
}

// Conversations lists, sorted, the conversations this host holds a
// sandbox for: a container or a workspace volume labelled as this host's
// (another host's objects and unlabelled ones are never listed). The
// runner's sandbox sweep asks the control plane about each.
func (b *Backend) Conversations(ctx context.Context) ([]string, error) {
	convs, err := b.conversations(ctx)
	if err != nil {
		return nil, fmt.Errorf("list docker sandboxes: %w", err)
	}
	return convs, nil
}

// Listed lists, sorted, the conversations this host holds a sandbox for
// (as Conversations) with the cluster identity each was created under
// (LabelCluster), "" when it carries none. The workspace volume's label
// wins over the container's: the volume holds the native session, and a
// container may have been made anew over it. The runner's sandbox sweep
// judges each only by that cluster's answer.
func (b *Backend) Listed(ctx context.Context) ([]sandbox.Listed, error) {
	ls, err := b.listed(ctx)
	if err != nil {
		return nil, fmt.Errorf("list docker sandboxes: %w", err)
	}
	return ls, nil
}

// CollectTeardownRecords returns, and removes, the records of the
// teardowns of its turns' agent trees the supervisor in the
// conversation's container could not prove (sandbox.TeardownRecordsDir in
// its host-side state directory, S6).
func (b *Backend) CollectTeardownRecords(ctx context.Context, conversationID string) ([]sandbox.TeardownRecord, error) {
	recs, err := sandbox.CollectTeardownRecords(b.stateDir(conversationID))
	if err != nil {
		return recs, fmt.Errorf("collect teardown records: %w", err)
	}
	return recs, ctx.Err()
}

// conversations lists, sorted, the conversations that have a container or
// a workspace volume of this host.
func (b *Backend) conversations(ctx context.Context) ([]string, error) {
	ls, err := b.listed(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ConversationID
	}
	return out, nil
}

// listed lists, sorted by conversation, this host's sandboxes and the
// cluster each was created under.
func (b *Backend) listed(ctx context.Context) ([]sandbox.Listed, error) {
	cluster := map[string]string{}
	cs, err := b.cfg.Engine.ContainerList(ctx, container.ListOptions{All: true, Filters: b.filter("", roleSandbox)})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		if conv := c.Labels[LabelConversation]; b.ours(c.Labels) && conv != "" {
			cluster[conv] = c.Labels[LabelCluster]
		}
	}
	vs, err := b.cfg.Engine.VolumeList(ctx, volume.ListOptions{Filters: b.filter("", roleWorkspace)})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	for _, v := range vs.Volumes {
		if conv := v.Labels[LabelConversation]; b.ours(v.Labels) && conv != "" {
			if c, ok := v.Labels[LabelCluster]; ok || cluster[conv] == "" {
				cluster[conv] = c
			}
		}
	}
	out := make([]sandbox.Listed, 0, len(cluster))
	for conv, c := range cluster {
		out = append(out, sandbox.Listed{ConversationID: conv, Cluster: c})
	}
	slices.SortFunc(out, func(a, b sandbox.Listed) int { return strings.Compare(a.ConversationID, b.ConversationID) })
	return out, nil
}

// errorClass names an error for a record without its text.
func errorClass(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil:
		return "cancelled"
	case errors.Is(err, ErrAmbiguous):
		return "ambiguous"
	default:
		return "engine"
	}
}
