// Package workerbatch is the daemon's per-host batching of attempt-scoped
// calls (renewals, reports): an http.RoundTripper that sends the calls
// its callers make while one batch request is in flight together, in the
// next POST /v1/agent/worker/batch, as soon as that one returns.
//
// Nothing waits on a timer: a call made while nothing is in flight is
// sent at once (a batch of one), so an idle host's latency is what it
// was. Each caller gets back the http.Response its per-call request
// would have got (status, body, Retry-After), so every retry policy
// above (the renewer's cadence, the receipts' and reports' rules) reads
// it as it did. A caller whose context ends while its call is queued is
// taken out of the queue, never sent, and gets its context's error; once
// sent, it gets that error at once, as an HTTP timeout does, and the
// batch goes on for the others; that job's calls then go on their own
// until one is answered, so that a job stuck at the control plane holds
// no other job's calls behind it.
//
// A control plane that answers the batch path 404 or 405 predates it:
// from then on every call is sent per call, as before. The transport sits
// under failover's (it sees each call already addressed to the replica in
// use, and a batch goes to that replica), so a failure of a batch reaches
// failover as each call's own.
package workerbatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/runnerd/runnerd/wire"
)

// itemOverhead is a generous bound of what one item adds to a batch's
// body besides its own body and token.
const itemOverhead = 256

// maxAnswerBytes bounds the batch answer read: every item's answer is
// small but for a refusal's sentence.
const maxAnswerBytes = wire.MaxBatchItems * 64 << 10

// Transport batches the attempt-scoped calls it carries.
type Transport struct {
	base      http.RoundTripper
	hostToken func() string

	// perCall is set once the control plane answered the batch path 404
	// or 405: every call goes on its own from then on.
	perCall atomic.Bool
	// batches counts the batch requests sent (tests and figures).
	batches atomic.Int64

	// mu guards lanes, each lane's queue and sending, and suspect.
	mu    sync.Mutex
	lanes map[string]*lane // by the batch URL (one per replica address)
	// suspect holds the jobs a call of which was sent in a batch and got
	// no answer within its caller's time: their calls go on their own
	// until one is answered, so that one stuck job cannot hold the
	// batches, and with them every other attempt's calls, behind it.
	suspect map[string]bool
}

// lane is the calls bound for one batch URL.
type lane struct {
	url     string
	queue   []*call
	sending bool // a batch request of this lane is in flight
}

// call is one caller's attempt-scoped request waiting for its answer.
type call struct {
	req  *http.Request
	body []byte
	item wire.BatchItem
	// done receives the one answer; buffered, so that delivering never
	// waits for a caller who left.
	done chan answer
}

type answer struct {
	resp *http.Response
	err  error
}

// New returns a Transport sending over base (nil: http.DefaultTransport)
// and authenticating its batches with hostToken, the host token now.
func New(base http.RoundTripper, hostToken func() string) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, hostToken: hostToken, lanes: map[string]*lane{}, suspect: map[string]bool{}}
}

// Batches is the number of batch requests sent so far.
func (t *Transport) Batches() int64 { return t.batches.Load() }

// CloseIdleConnections passes on to base (the renewer closes its idle
// connections after failures).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// jobsPath is the path prefix of the attempt-scoped calls.
var jobsPath = strings.TrimSuffix(wire.AttemptPath("", ""), "/")

// batchable reports the batch URL and item of req if it is an
// attempt-scoped call a batch carries.
func batchable(req *http.Request) (string, wire.BatchItem, bool) {
	if req.Method != http.MethodPost || req.Body == nil {
		return "", wire.BatchItem{}, false
	}
	at := strings.Index(req.URL.Path, jobsPath)
	if at < 0 {
		return "", wire.BatchItem{}, false
	}
	job, op, ok := strings.Cut(req.URL.Path[at+len(jobsPath):], "/")
	if !ok || job == "" || strings.Contains(op, "/") || !slices.Contains(wire.BatchOps, op) {
		return "", wire.BatchItem{}, false
	}
	scheme, tok, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", wire.BatchItem{}, false
	}
	u := *req.URL
	u.Path, u.RawPath, u.RawQuery = req.URL.Path[:at]+wire.PathWorkerBatch, "", ""
	return u.String(), wire.BatchItem{Op: op, JobID: job, WorkerToken: strings.TrimSpace(tok)}, true
}

// RoundTrip sends req in the next batch of its replica, or on its own if
// it is no attempt-scoped call or the control plane takes no batches.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	url, item, ok := batchable(req)
	if !ok || t.perCall.Load() {
		return t.base.RoundTrip(req)
	}
	t.mu.Lock()
	alone := t.suspect[item.JobID]
	t.mu.Unlock()
	if alone {
		resp, err := t.base.RoundTrip(req)
		if err == nil {
			t.mu.Lock()
			delete(t.suspect, item.JobID)
			t.mu.Unlock()
		}
		return resp, err
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, wire.MaxBodyBytes+1))
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	c := &call{req: req, body: body, item: item, done: make(chan answer, 1)}
	if len(body) > wire.MaxBodyBytes || !json.Valid(body) {
		return t.base.RoundTrip(c.perCallRequest()) // the per-call endpoint refuses it as it always did
	}
	c.item.Body = body

	t.mu.Lock()
	l := t.lanes[url]
	if l == nil {
		l = &lane{url: url}
		t.lanes[url] = l
	}
	l.queue = append(l.queue, c)
	if !l.sending {
		l.sending = true
		go t.send(l)
	}
	t.mu.Unlock()

	select {
	case a := <-c.done:
		return a.resp, a.err
	case <-req.Context().Done():
		t.mu.Lock()
		if i := slices.Index(l.queue, c); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1) // never sent
		} else {
			t.suspect[item.JobID] = true // sent, and no answer in time
		}
		t.mu.Unlock()
		return nil, req.Context().Err()
	}
}

// send sends l's queue, batch after batch, until it is empty.
func (t *Transport) send(l *lane) {
	for {
		t.mu.Lock()
		calls := take(&l.queue)
		if len(calls) == 0 {
			l.sending = false
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		if t.perCall.Load() {
			t.sendEach(calls)
			continue
		}
		t.sendBatch(l.url, calls)
	}
}

// take removes from the front of queue the calls of the next batch: at
// most MaxBatchItems, their body within MaxBatchBodyBytes.
func take(queue *[]*call) []*call {
	n, size := 0, 0
	for _, c := range *queue {
		s := len(c.item.Body) + len(c.item.WorkerToken) + len(c.item.JobID) + itemOverhead
		if n == wire.MaxBatchItems || (n > 0 && size+s > wire.MaxBatchBodyBytes-itemOverhead) {
			break
		}
		n, size = n+1, size+s
	}
	calls := slices.Clone((*queue)[:n])
	*queue = slices.Delete(*queue, 0, n)
	return calls
}

// sendEach sends each call on its own, at once.
func (t *Transport) sendEach(calls []*call) {
	for _, c := range calls {
		go func() {
			resp, err := t.base.RoundTrip(c.perCallRequest())
			c.done <- answer{resp, err}
		}()
	}
}

// sendBatch sends calls in one batch request and gives each its answer.
// The request lasts while any of its callers waits for it: it is
// cancelled once every one's context has ended.
func (t *Transport) sendBatch(url string, calls []*call) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := atomic.Int64{}
	waiting.Store(int64(len(calls)))
	items := make([]wire.BatchItem, len(calls))
	for i, c := range calls {
		items[i] = c.item
		stop := context.AfterFunc(c.req.Context(), func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	body, err := json.Marshal(wire.WorkerBatch{Items: items})
	if err != nil {
		t.failAll(calls, fmt.Errorf("encode batch: %w", err))
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.failAll(calls, err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+t.hostToken())
	t.batches.Add(1)
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		t.failAll(calls, err)
		return
	}
	defer resp.Body.Close()
	switch s := resp.StatusCode; {
	case s == http.StatusNotFound || s == http.StatusMethodNotAllowed:
		// A control plane without the batch path: per call for good.
		t.perCall.Store(true)
		t.sendEach(calls)
		return
	case s == http.StatusOK:
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		// No verdict on any item: each gets the answer, as its own
		// request would have (its retry policy and failover read it).
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		for _, c := range calls {
			c.done <- answer{resp: c.response(s, resp.Header.Get("Retry-After"), b)}
		}
		return
	default:
		// The batch itself refused (its host token, its shape): no
		// verdict on any worker token; each goes on its own this once.
		t.sendEach(calls)
		return
	}
	var out wire.WorkerBatchResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(&out); err != nil {
		t.failAll(calls, fmt.Errorf("decode batch answer: %w", err))
		return
	}
	if len(out.Results) != len(calls) {
		t.failAll(calls, fmt.Errorf("batch answer: %d results for %d items", len(out.Results), len(calls)))
		return
	}
	for i, c := range calls {
		r := out.Results[i]
		c.done <- answer{resp: c.response(r.Status, r.RetryAfter, r.Body)}
	}
}

func (t *Transport) failAll(calls []*call, err error) {
	for _, c := range calls {
		c.done <- answer{err: err}
	}
}

// perCallRequest is the call's own request, its body restored.
func (c *call) perCallRequest() *http.Request {
	r := c.req.Clone(c.req.Context())
	r.Body = io.NopCloser(bytes.NewReader(c.body))
	r.ContentLength = int64(len(c.body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(c.body)), nil }
	return r
}

// response is the answer the call's per-call request would have got.
func (c *call) response(status int, retryAfter string, body []byte) *http.Response {
	h := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}}
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		Request: c.req,
	}
}
