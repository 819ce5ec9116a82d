package settlement

import (
	"context"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// PermissionAnswer asks the control plane, once, for the owner's answer to
// the attempt's ACP permission request requestID, held there up to wait:
// the option chosen, or "" when none came. It is a read, fenced like every
// call of the attempt: after a lease rejection it sends nothing. The
// caller polls again at its own pace.
func (s *Session) PermissionAnswer(ctx context.Context, requestID string, wait time.Duration) (string, error) {
	p := uploadPolicy(s.cfg.Receipts)
	p.Name = wire.OpPermissions
	p.TryTimeout += wait // the long poll holds the answer up to wait
	var option string
	err := s.rep.do(ctx, &write{op: wire.OpPermissions, policy: p}, func(ctx context.Context, wc *wire.Client) error {
		var err error
		option, err = wc.PermissionAnswer(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.PermissionsRequest{
			AttemptRef: s.cfg.Attempt, RequestID: requestID, WaitMS: wait.Milliseconds()})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("permission answer for job %s: %w", s.cfg.JobID, err)
	}
	return option, nil
}
