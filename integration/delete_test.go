package integration

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/sandbox/docker"
	"github.com/runnerd/runnerd/wire"
)

// volumes are the names of the conversation's workspace volumes on the
// engine.
func (e *dockerEnv) volumes(convID string) []string {
	e.t.Helper()
	resp, err := e.eng.VolumeList(e.ctx, volume.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", docker.LabelHost+"="+e.host),
		filters.Arg("label", docker.LabelConversation+"="+convID),
	)})
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, v := range resp.Volumes {
		names = append(names, v.Name)
	}
	return names
}

// TestS3DeleteRemovesSandboxDocker is S3 end to end: the real control
// plane, the real daemon with the Docker backend against the real engine.
// A turn leaves its retained container and workspace volume; the owner
// deletes the conversation; the daemon's sweep, asking the cluster it
// pinned, hears "deleted" and removes both (one runnerd_sandbox_swept
// record, reason deleted) while another conversation's sandbox stays; a
// message to the deleted conversation is 410 gone.
func TestS3DeleteRemovesSandboxDocker(t *testing.T) {
	t.Parallel()
	e := newDockerEnv(t, envOpts{}, "")
	d := e.startDaemon(func(c *fleet.DaemonConfig) {
		c.Sandbox = "docker"
		c.Args = append(c.Args, "--sandbox-sweep", "300ms")
	})
	deleted, kept := e.conversation("deleted in docker"), e.conversation("kept in docker")
	for _, c := range []wire.Conversation{deleted, kept} {
		if j := e.waitEnded(e.send(c.ID, "hello").ID); j.State != wire.JobSucceeded {
			t.Fatalf("turn of %s: %s", c.ID, describeJob(j))
		}
		if len(e.containers(c.ID)) != 1 || len(e.volumes(c.ID)) != 1 {
			t.Fatalf("after its turn %s has containers %v and volumes %v, want one of each", c.ID, e.containers(c.ID), e.volumes(c.ID))
		}
	}

	mark := d.Mark()
	if cv, err := e.user.Delete(e.ctx, deleted.ID); err != nil || cv.State != wire.ConversationDeleted {
		t.Fatalf("delete: %+v, %v", cv, err)
	}
	swept := regexp.MustCompile(`"msg":"runnerd_sandbox_swept".*"conversation_id":"` + regexp.QuoteMeta(deleted.ID) + `".*"reason":"deleted"`)
	if _, err := d.AwaitOutput(mark, swept, waitFor); err != nil {
		t.Fatalf("no sweep of the deleted conversation: %v\n%s", err, d.Output())
	}
	if ids, vols := e.containers(deleted.ID), e.volumes(deleted.ID); len(ids) != 0 || len(vols) != 0 {
		t.Errorf("the deleted conversation still has containers %v and volumes %v", ids, vols)
	}
	if ids, vols := e.containers(kept.ID), e.volumes(kept.ID); len(ids) != 1 || len(vols) != 1 {
		t.Errorf("the other conversation has containers %v and volumes %v, want its one of each", ids, vols)
	}
	_, err := e.user.Send(e.ctx, deleted.ID, "still there?")
	if se, ok := err.(*wire.StatusError); !ok || se.Status != http.StatusGone || se.Code != wire.CodeGone {
		t.Errorf("message to the deleted conversation: %v, want 410 gone", err)
	}
}
