package controlplane

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"sync"

	"github.com/runnerd/runnerd/wire"
)

// maxBatchJobsAtOnce bounds how many jobs' items of one batch are in the
// store at once: enough for the store's coalescers to gather many into
// one statement, few enough that one request cannot hold every
// connection of the pool.
const maxBatchJobsAtOnce = 64

// errOtherHost refuses a batch item whose worker token is a real one of
// an attempt another host holds.
var errOtherHost = refuse(http.StatusForbidden, wire.CodeForbidden, "The worker token belongs to another host's attempt.")

// attemptHandlers are the per-call handlers of the attempt-scoped calls a
// batch item may carry, by op: the routes (Handler) and the batch
// dispatch the same code.
func (s *Server) attemptHandlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		wire.OpRenew:      s.handleRenew,
		wire.OpEvents:     s.handleEvents,
		wire.OpContainer:  s.handleContainer,
		wire.OpAdmission:  s.handleAdmission,
		wire.OpSettlement: s.handleSettlement,
		wire.OpNotices:    s.handleNotice,
		wire.OpAbandon:    s.handleAbandon,
		wire.OpRelease:    s.handleRelease,
		wire.OpFinish:     s.handleFinish,
	}
}

// handleWorkerBatch answers a host's batch of attempt-scoped calls of its
// attempts (wire.WorkerBatch). The host token authenticates the request;
// each item is the per-call request it stands for, handed to that call's
// own handler with its own worker token, and answered with what that
// handler answered, after the store's commit of it. An item whose token
// is another host's attempt's is refused 403 on its own. The items of a
// job run in their order; those of different jobs run at once, so that
// the store gathers them into shared statements.
func (s *Server) handleWorkerBatch(w http.ResponseWriter, r *http.Request) {
	const op = "worker_batch"
	h, ok := s.host(w, r, op)
	if !ok {
		return
	}
	var req wire.WorkerBatch
	if e := decodeJSON(http.MaxBytesReader(w, r.Body, wire.MaxBatchBodyBytes), &req, "items"); e != nil {
		if e == errBodyTooLarge {
			e = refuse(http.StatusBadRequest, wire.CodeBodyTooLarge, "The batch body is larger than "+strconv.Itoa(wire.MaxBatchBodyBytes)+" bytes.")
		}
		writeError(w, e)
		return
	}
	handlers := s.attemptHandlers()
	switch n := len(req.Items); {
	case n == 0:
		writeError(w, invalid("items must hold at least one item."))
		return
	case n > wire.MaxBatchItems:
		writeError(w, invalid("items holds %d items; a batch carries at most %d.", n, wire.MaxBatchItems))
		return
	}
	for i, it := range req.Items {
		switch {
		case handlers[it.Op] == nil:
			writeError(w, invalid("items[%d].op must be one of renew, events, container, admission, settlement, notices, abandon, release, finish.", i))
			return
		case it.WorkerToken == "":
			writeError(w, invalid("items[%d].worker_token is required.", i))
			return
		case it.JobID == "" || len(it.JobID) > 128 || bytes.ContainsAny([]byte(it.JobID), "/?#%"):
			writeError(w, invalid("items[%d].job_id must be a job id.", i))
			return
		case len(it.Body) > wire.MaxBodyBytes:
			writeError(w, invalid("items[%d].body is larger than %d bytes.", i, wire.MaxBodyBytes))
			return
		}
	}

	// The items by job, each job's in the batch's order.
	var jobs [][]int
	byJob := map[string]int{}
	for i, it := range req.Items {
		j, seen := byJob[it.JobID]
		if !seen {
			j = len(jobs)
			byJob[it.JobID] = j
			jobs = append(jobs, nil)
		}
		jobs[j] = append(jobs[j], i)
	}
	results := make([]wire.BatchResult, len(req.Items))
	sem := make(chan struct{}, maxBatchJobsAtOnce)
	var wg sync.WaitGroup
	for _, items := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			owner := map[string]bool{} // worker token → whether it is this host's attempt's, once per token
			for _, i := range items {
				it := req.Items[i]
				mine, asked := owner[it.WorkerToken]
				if !asked {
					mine = s.hostsAttempt(r.Context(), h.ID, it)
					owner[it.WorkerToken] = mine
				}
				if !mine {
					results[i] = resultOf(errOtherHost)
				} else {
					results[i] = s.dispatch(r, handlers[it.Op], it)
				}
				s.cfg.Metrics.countAnswer("POST "+wire.AttemptPath("{job}", it.Op), results[i].Status)
				s.cfg.Metrics.batchItems.WithLabelValues(it.Op, strconv.Itoa(results[i].Status)).Inc()
			}
		})
	}
	wg.Wait()
	s.cfg.Metrics.batches.Inc()
	writeJSON(w, http.StatusOK, wire.WorkerBatchResponse{Results: results})
}

// hostsAttempt reports whether the item's worker token is, as far as the
// store knows, not another host's attempt's. A token the store does not
// map to an attempt of the job is left to the item's own handler, which
// refuses it as the per-call endpoint does.
func (s *Server) hostsAttempt(ctx context.Context, hostID string, it wire.BatchItem) bool {
	hash := HashToken(it.WorkerToken)
	key := it.JobID + "\x00" + string(hash)
	if owner, ok := s.owners.get(key); ok {
		return owner == hostID
	}
	a, err := s.cfg.Store.AuthorizeAttempt(ctx, it.JobID, hash)
	if err != nil {
		return true
	}
	s.owners.put(key, a.HostID)
	return a.HostID == hostID
}

// maxOwners bounds ownerCache; it starts again empty when full.
const maxOwners = 1 << 16

// ownerCache remembers which host holds the attempt of a (job, worker
// token hash): a fact that never changes once the claim made it, so a
// renewal every interval asks the store once per attempt, not per batch.
// Whether the attempt still holds its lease is the item's own handler's
// question, asked every time.
type ownerCache struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]string // job id NUL token hash → host id
}

func (c *ownerCache) get(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[key]
	return h, ok
}

func (c *ownerCache) put(key, hostID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxOwners {
		c.m = make(map[string]string)
	}
	c.m[key] = hostID
}

// dispatch hands the item to the per-call handler as the request it
// stands for, and records what the handler answered.
func (s *Server) dispatch(batch *http.Request, handle http.HandlerFunc, it wire.BatchItem) wire.BatchResult {
	req, err := http.NewRequestWithContext(batch.Context(), http.MethodPost, wire.AttemptPath(it.JobID, it.Op), bytes.NewReader(it.Body))
	if err != nil {
		return resultOf(invalid("job_id must be a job id."))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+it.WorkerToken)
	req.SetPathValue("job", it.JobID)
	rec := &itemRecorder{header: http.Header{}}
	handle(rec, req)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	return wire.BatchResult{Status: status, RetryAfter: rec.header.Get("Retry-After"),
		Body: bytes.TrimRight(rec.body.Bytes(), "\n")}
}

// resultOf is a refusal the batch judged itself, as an item's answer.
func resultOf(e *apiError) wire.BatchResult {
	rec := &itemRecorder{header: http.Header{}}
	writeError(rec, e)
	return wire.BatchResult{Status: e.status, Body: bytes.TrimRight(rec.body.Bytes(), "\n")}
}

// itemRecorder is the http.ResponseWriter of one batch item: it keeps the
// status, headers and body the handler wrote. One goroutine uses it.
type itemRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *itemRecorder) Header() http.Header { return w.header }

func (w *itemRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *itemRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
