package store

import (
	"encoding/json"

	"github.com/runnerd/runnerd/wire"
)

// PendingPermissions are the ACP permission requests among a job's events
// that wait for the owner: a "permission_requested" of the job's running
// turn under the ask policy, with no "permission_answered" of the
// supervisor (policy, timeout, cancel, the owner's answer delivered) and no
// "permission_answer" of the owner recorded yet. Only the running
// attempt's: a job that is not running, or an attempt that ended, has
// none waiting (its turn is over, and so are its requests).
func PendingPermissions(j wire.Job, events []wire.JobEvent) []wire.PermissionRequest {
	running := ""
	for _, a := range j.Attempts {
		if a.State == wire.AttemptRunning {
			running = a.ID
		}
	}
	if j.State != wire.JobRunning || running == "" {
		return nil
	}
	var out []wire.PermissionRequest
	done := map[string]bool{}
	for _, e := range events {
		var d struct {
			RequestID string                  `json:"request_id"`
			Policy    string                  `json:"policy"`
			ToolCall  json.RawMessage         `json:"tool_call"`
			Options   []wire.PermissionOption `json:"options"`
		}
		switch e.Type {
		case wire.EventPermissionRequested, wire.EventPermissionAnswered, wire.EventPermissionAnswer:
		default:
			continue
		}
		if e.AttemptID != running || json.Unmarshal(e.Data, &d) != nil || d.RequestID == "" {
			continue
		}
		if e.Type != wire.EventPermissionRequested {
			done[d.RequestID] = true
			continue
		}
		if d.Policy != wire.PermissionAsk {
			continue // answered by the policy at once
		}
		out = append(out, wire.PermissionRequest{RequestID: d.RequestID, AttemptID: e.AttemptID, Time: e.Time, ToolCall: d.ToolCall, Options: d.Options})
	}
	pending := out[:0]
	for _, p := range out {
		if !done[p.RequestID] {
			pending = append(pending, p)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	return pending
}
