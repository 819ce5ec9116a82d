package turn

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/internal/retry"
	"github.com/runnerd/runnerd/sandbox"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// PermissionPollWait is how long each of the child's polls for the
// owner's answer to a permission request is held by the control plane.
const PermissionPollWait = 25 * time.Second

// permissionWatch carries the owner's answers to an ACP turn's permission
// requests under the ask policy from the control plane to the supervisor
// (A4): for each "permission_requested" event the turn emits, one
// goroutine long-polls the control plane for the answer the owner
// recorded (POST /v1/jobs/{job}/permissions/{request}) and passes it on
// with Turn.Answer, until the supervisor's "permission_answered" event
// says the request is over (answered, timed out, cancelled) or the turn
// ends. The daemon renews the lease the whole time, as for any turn (R9).
type permissionWatch struct {
	t      *turn
	stream *sandbox.Turn
	ctx    context.Context
	wg     sync.WaitGroup

	mu      sync.Mutex // guards waiting
	waiting map[string]context.CancelFunc
}

func (t *turn) watchPermissions(ctx context.Context, stream *sandbox.Turn) *permissionWatch {
	return &permissionWatch{t: t, stream: stream, ctx: ctx, waiting: map[string]context.CancelFunc{}}
}

// saw looks at one event of the turn, in order.
func (w *permissionWatch) saw(ev sandbox.Event) {
	if ev.Type != wire.EventPermissionRequested && ev.Type != wire.EventPermissionAnswered {
		return
	}
	var d struct {
		RequestID string `json:"request_id"`
		Policy    string `json:"policy"`
	}
	if json.Unmarshal(ev.Data, &d) != nil || d.RequestID == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ev.Type == wire.EventPermissionAnswered {
		if stop, ok := w.waiting[d.RequestID]; ok {
			stop()
			delete(w.waiting, d.RequestID)
		}
		return
	}
	if d.Policy != wire.PermissionAsk {
		return
	}
	ctx, stop := context.WithCancel(w.ctx)
	w.waiting[d.RequestID] = stop
	w.wg.Go(func() { w.poll(ctx, d.RequestID) })
}

// poll waits for the owner's answer to one request and passes it on.
// A transient failure or a server fault pauses under a backoff; a refusal
// (a control plane without the call, the lease lost) or a lease rejection
// ends it: the request then ends at its timeout, or with the turn.
func (w *permissionWatch) poll(ctx context.Context, requestID string) {
	pauses := retry.Policy{Name: "permissions", Wait: time.Second, MaxWait: 30 * time.Second}.Backoff()
	for ctx.Err() == nil {
		option, err := w.t.sess.PermissionAnswer(ctx, requestID, PermissionPollWait)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, settlement.ErrLeaseRejected) {
				return
			}
			if c := wire.Classify(err); c != wire.Transient && c != wire.ServerFault {
				w.t.log.Warn(diagnostics.MsgPermissionAnswerFailed, "request_id", requestID,
					"error_class", diagnostics.Class(err), "status", diagnostics.Status(err))
				return
			}
			timer := time.NewTimer(pauses.NextBackOff())
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			continue
		}
		if option == "" {
			continue
		}
		if err := w.stream.Answer(requestID, option); err != nil {
			w.t.log.Warn(diagnostics.MsgPermissionAnswerFailed, "request_id", requestID, "error_class", sandbox.CodeOf(err))
			return
		}
		w.t.log.Info(diagnostics.MsgPermissionAnswerPassed, "request_id", requestID, "option_id", option)
		return
	}
}

// stop ends every poll and waits for them.
func (w *permissionWatch) stop() {
	w.mu.Lock()
	for id, stop := range w.waiting {
		stop()
		delete(w.waiting, id)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
