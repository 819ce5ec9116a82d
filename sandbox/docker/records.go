package docker

import (
	"context"
	"log/slog"
	"time"
)

// Record names of this package. Fields are ids and classes only: never an
// error's text, a prompt or a token.
const (
	RecordContainerCreated = "sandbox_container_created"
	RecordContainerStarted = "sandbox_container_started"
	RecordContainerRestart = "sandbox_container_restarted"
	RecordContainerStopped = "sandbox_container_stopped" // Stop: stopped and kept (idle eviction)
	RecordSwept            = "sandbox_swept"
	RecordSweepFailed      = "sandbox_sweep_failed"
	// RecordStateAdopted: the native turn boundary the previous release
	// kept in the workspace volume was moved to the state directory.
	RecordStateAdopted = "sandbox_state_adopted"
	// RecordContainerReplaced: a container of the previous release's
	// layout was removed, to be made anew over the same workspace.
	RecordContainerReplaced = "sandbox_container_replaced"
	// RecordSupervisorOutdated: a supervisor of an older protocol was kept
	// for a turn (busy, or mounting another binary than ours), which then
	// runs with that version's features only.
	RecordSupervisorOutdated = "sandbox_supervisor_outdated"
)

func recordCreated(l *slog.Logger, conv, id string) {
	recordContainer(l, RecordContainerCreated, conv, id)
}
func recordStarted(l *slog.Logger, conv, id string) {
	recordContainer(l, RecordContainerStarted, conv, id)
}

func recordContainer(l *slog.Logger, msg, conv, id string) {
	l.LogAttrs(context.Background(), slog.LevelInfo, msg,
		slog.String("backend", "docker"),
		slog.String("conversation_id", conv),
		slog.String("container_id", id))
}

// recordRestarted says a running container was restarted, and why (a class).
func recordRestarted(l *slog.Logger, conv, id, class string) {
	l.LogAttrs(context.Background(), slog.LevelWarn, RecordContainerRestart,
		slog.String("backend", "docker"),
		slog.String("conversation_id", conv),
		slog.String("container_id", id),
		slog.String("class", class))
}

// recordSwept says the sweep removed a conversation's sandbox; container_id
// is empty when only a workspace volume was left.
func recordSwept(l *slog.Logger, conv, id, volume string) {
	l.LogAttrs(context.Background(), slog.LevelInfo, RecordSwept,
		slog.String("backend", "docker"),
		slog.String("conversation_id", conv),
		slog.String("container_id", id),
		slog.String("volume", volume))
}

// recordSweepFailed carries a class, never the engine's error text.
func recordSweepFailed(l *slog.Logger, conv, class string) {
	l.LogAttrs(context.Background(), slog.LevelWarn, RecordSweepFailed,
		slog.String("backend", "docker"),
		slog.String("conversation_id", conv),
		slog.String("class", class))
}

func recordOutdatedKept(l *slog.Logger, conv, id string, version int, busy bool) {
	reason := "not_our_binary"
	if busy {
		reason = "busy"
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, RecordSupervisorOutdated,
		slog.String("backend", "docker"),
		slog.String("conversation_id", conv),
		slog.String("container_id", id),
		slog.Int("version", version),
		slog.String("reason", reason))
}

// Records of image pulls (Config.Pull): the image as the conversation
// names it and how long the pull took. A failed pull's reason goes to the
// turn's own records and its job timeline, never here.
const (
	RecordImagePulled     = "sandbox_image_pulled"
	RecordImagePullFailed = "sandbox_image_pull_failed"
)

func recordPull(l *slog.Logger, msg, ref string, took time.Duration) {
	level := slog.LevelInfo
	if msg == RecordImagePullFailed {
		level = slog.LevelWarn
	}
	l.LogAttrs(context.Background(), level, msg,
		slog.String("backend", "docker"),
		slog.String("image", ref),
		slog.Int64("duration_ms", took.Milliseconds()))
}
