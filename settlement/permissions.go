package settlement

import (
	"context"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// PermissionAnswer asks the control plane, once, for the owner's answer to
// the attempt's ACP permission request requestID, held there up to wait:
// the option chosen, or "" when none came. After a lease rejection it
// sends nothing (the fence). It is a read and decides nothing about the
// lease: a refusal (a control plane without the call answers 404) is
// returned, not taken as the lease's loss — the renewals decide that. The
// caller polls again at its own pace.
func (s *Session) PermissionAnswer(ctx context.Context, requestID string, wait time.Duration) (string, error) {
	p := uploadPolicy(s.cfg.Receipts)
	p.Name = wire.OpPermissions
	p.TryTimeout += wait // the long poll holds the answer up to wait
	tries := 0
	wc := &wire.Client{BaseURL: s.cfg.BaseURL, HTTP: p.HTTP(fence{r: s.rep, base: s.cfg.Transport, tries: &tries}, nil)}
	option, err := wc.PermissionAnswer(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.PermissionsRequest{
		AttemptRef: s.cfg.Attempt, RequestID: requestID, WaitMS: wait.Milliseconds()})
	if err != nil {
		return "", fmt.Errorf("permission answer for job %s: %w", s.cfg.JobID, err)
	}
	return option, nil
}
