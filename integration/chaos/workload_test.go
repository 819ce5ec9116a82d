package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/runnerd/runnerd/integration/chaos/checker"
	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// scripts are the demo agent's turns the campaign draws from (cmd/demoagent
// reads the directives): a stream, silence longer than a renewal interval,
// a slow turn, exit codes, a crash, plain text. Weights sum to 100.
var scripts = []struct {
	weight int
	name   string
	body   string
}{
	{25, "stream", "!events 20"},
	{15, "silent", "!silent 900ms"},
	{15, "slow", "!events 3\n!sleep 1500ms\n!events 3"},
	{10, "exit", "!exit 3"},
	{5, "crash", "!crash"},
	{30, "plain", "hello"},
}

func drawScript(rng *rand.Rand) (name, body string) {
	n := rng.IntN(100)
	for _, s := range scripts {
		if n < s.weight {
			return s.name, s.body
		}
		n -= s.weight
	}
	return scripts[len(scripts)-1].name, scripts[len(scripts)-1].body
}

// sentTurn is one message the campaign sent.
type sentTurn struct {
	conv, job, prompt, script string
}

// workload drives conversations, one turn at a time each, until turns
// have been sent in all; it returns the conversations and the turns.
type workload struct {
	w      *world
	convs  []conv // the conversations the turns start in
	script string // every turn's directives; "" draws them
	fresh  bool   // every turn in a conversation of its own (none is pinned to a host)

	mu   sync.Mutex // guards sent and all
	sent []sentTurn
	all  []string // every conversation's id, those opened after a LOST one too
}

type conv struct {
	wire.Conversation
	spec convSpec
}

type convSpec struct {
	sandbox  string
	image    string
	agent    []string
	protocol string // wire.AgentProtocolACP or "" (lines)
}

func (wl *workload) create(ctx context.Context, n int, spec convSpec) error {
	for range n {
		c, err := wl.open(ctx, spec)
		if err != nil {
			return err
		}
		wl.convs = append(wl.convs, conv{c, spec})
	}
	return nil
}

func (wl *workload) open(ctx context.Context, spec convSpec) (wire.Conversation, error) {
	var c wire.Conversation
	err := wl.w.user(ctx, func(u *fleet.User) error {
		var err error
		req := wire.CreateConversationRequest{Title: "chaos " + spec.sandbox,
			Image: spec.image, AgentCommand: spec.agent, Sandbox: spec.sandbox}
		if spec.protocol == wire.AgentProtocolACP {
			req.Title += " acp"
			req.AgentProtocol, req.PermissionPolicy = wire.AgentProtocolACP, wire.PermissionAllow
		}
		c, err = u.Create(ctx, req)
		return err
	})
	if err != nil {
		return c, fmt.Errorf("create a conversation: %w", err)
	}
	wl.mu.Lock()
	wl.all = append(wl.all, c.ID)
	wl.mu.Unlock()
	return c, nil
}

// run sends turns in all conversations, each conversation's next message
// once its previous turn ended, until total were sent. A conversation the
// control plane calls LOST takes no more: a new one of the same kind takes
// its remaining turns. A turn that does not end within turnBound stops its
// conversation (the checker counts it).
func (wl *workload) run(ctx context.Context, total int, turnBound time.Duration) {
	var wg sync.WaitGroup
	per := total / len(wl.convs)
	extra := total % len(wl.convs)
	for i, c := range wl.convs {
		n := per
		if i < extra {
			n++
		}
		rng := rand.New(rand.NewPCG(wl.w.seed, uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			wl.converse(ctx, i, c, n, rng, turnBound)
		}()
	}
	wg.Wait()
}

func (wl *workload) converse(ctx context.Context, ci int, c conv, n int, rng *rand.Rand, bound time.Duration) {
	id := c.ID
	for k := 1; k <= n && ctx.Err() == nil; k++ {
		name, body := drawScript(rng)
		if wl.script != "" {
			name, body = "fixed", wl.script
		}
		// Every prompt is unique: the checker finds its job by its text.
		prompt := fmt.Sprintf("chaos seed %d conversation %d turn %d (%s)\n%s", wl.w.seed, ci, k, name, body)
		var j wire.Job
		ambiguous, err := wl.w.userOnce(ctx, func(u *fleet.User) error {
			var err error
			j, err = u.Send(ctx, id, prompt)
			return err
		})
		var se *wire.StatusError
		lost := errors.As(err, &se) && se.Status == http.StatusConflict && se.Code == wire.CodeConversationLost
		if lost || ambiguous {
			// LOST: it takes no new message. Ambiguous: the message may
			// be queued, and sending it again would be a second turn of
			// the same prompt (the history knows the job if the replica
			// answered). Either way a new conversation goes on.
			if ambiguous {
				wl.w.t.Logf("conversation %s: the send of turn %d got no answer (%v); going on in a new conversation", id, k, err)
			}
			// A replica or the database may be down right now (503): try
			// again for a while rather than end this conversation's share
			// of the turns. (A create whose answer was lost leaves an
			// empty conversation: nothing to judge.)
			var nc wire.Conversation
			octx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := fleet.Poll(octx, 500*time.Millisecond, "a new conversation", func(ctx context.Context) (bool, error) {
				var err error
				nc, err = wl.open(ctx, c.spec)
				return err == nil, err
			})
			cancel()
			if err != nil {
				wl.w.t.Logf("after conversation %s was lost: %v", id, err)
				return
			}
			id = nc.ID
			k--
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				wl.w.t.Logf("conversation %s: send turn %d: %v", id, k, err)
			}
			return
		}
		wl.mu.Lock()
		wl.sent = append(wl.sent, sentTurn{conv: id, job: j.ID, prompt: prompt, script: name})
		wl.mu.Unlock()
		if c.spec.protocol == wire.AgentProtocolACP && rng.IntN(4) == 0 {
			// The owner cancels a share of the ACP turns once they run:
			// session/cancel, and the agent's own "cancelled" (K10).
			wl.cancelRunning(ctx, j.ID, bound)
		}
		if _, ended := wl.w.waitEnded(ctx, j.ID, bound); !ended {
			return
		}
		if wl.fresh && k < n {
			nc, err := wl.open(ctx, c.spec)
			if err != nil {
				wl.w.t.Logf("open a conversation: %v", err)
				return
			}
			id = nc.ID
		}
	}
}

// cancelRunning cancels the job once it runs, unless it ended first or
// bound passed.
func (wl *workload) cancelRunning(ctx context.Context, id string, bound time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var j wire.Job
	err := fleet.Poll(wctx, 100*time.Millisecond, "job "+id+" to run", func(ctx context.Context) (bool, error) {
		err := wl.w.user(ctx, func(u *fleet.User) error {
			var err error
			j, err = u.Job(ctx, id)
			return err
		})
		return err == nil && (j.State == wire.JobRunning || fleet.Ended(j.State)), nil
	})
	if err != nil || fleet.Ended(j.State) {
		return
	}
	if err := wl.w.user(ctx, func(u *fleet.User) error { _, err := u.Cancel(ctx, id); return err }); err != nil && ctx.Err() == nil {
		wl.w.t.Logf("cancel job %s: %v", id, err)
	}
}

// waitEnded polls a job until it ended or bound passed.
func (w *world) waitEnded(ctx context.Context, id string, bound time.Duration) (wire.Job, bool) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var j wire.Job
	err := fleet.Poll(ctx, 300*time.Millisecond, "job "+id+" to end", func(ctx context.Context) (bool, error) {
		err := w.user(ctx, func(u *fleet.User) error {
			var err error
			j, err = u.Job(ctx, id)
			return err
		})
		return err == nil && fleet.Ended(j.State), nil
	})
	return j, err == nil
}

// final records every job (with its events) and every conversation as the
// user API shows them now.
func (wl *workload) final(ctx context.Context) (jobs []wire.Job, convs []wire.Conversation, err error) {
	wl.w.jobsMu.Lock()
	ids := slices.Clone(wl.w.jobs)
	wl.w.jobsMu.Unlock()
	wl.mu.Lock()
	for _, s := range wl.sent {
		if !slices.Contains(ids, s.job) {
			ids = append(ids, s.job)
		}
	}
	wl.mu.Unlock()
	for _, id := range ids {
		var j wire.Job
		if err := wl.w.user(ctx, func(u *fleet.User) error {
			var err error
			j, err = u.Job(ctx, id)
			return err
		}); err != nil {
			return nil, nil, fmt.Errorf("read job %s: %w", id, err)
		}
		jobs = append(jobs, j)
		for _, ev := range j.Events {
			_ = wl.w.hist.Write(checker.Record{ConversationID: j.ConversationID, JobID: j.ID, AttemptID: ev.AttemptID, Event: &ev})
		}
		rec := j
		rec.Events = nil // recorded one by one above
		_ = wl.w.hist.Write(checker.Record{ConversationID: j.ConversationID, JobID: j.ID, Job: &rec})
	}
	wl.mu.Lock()
	all := append([]string(nil), wl.all...)
	wl.mu.Unlock()
	for _, id := range all {
		var cv wire.Conversation
		if err := wl.w.user(ctx, func(u *fleet.User) error {
			var err error
			cv, err = u.Conversation(ctx, id)
			return err
		}); err != nil {
			return nil, nil, fmt.Errorf("read conversation %s: %w", id, err)
		}
		convs = append(convs, cv)
		_ = wl.w.hist.Write(checker.Record{ConversationID: cv.ID, Conversation: &cv})
	}
	return jobs, convs, nil
}
