package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runnerd/runnerd/integration/chaos/checker"
	"github.com/runnerd/runnerd/wire"
)

// codeUnreached is the user recorder's own answer to a request it could
// not even send to its replica.
const codeUnreached = "chaos_unreached"

// recorder is the HTTP hop between one host's fault proxy and one
// replica: it forwards every request, records it with its answer in the
// history, and can withhold answers (drop_response: the request reaches
// the replica and commits, the answer never reaches the host — its
// connection stays silent until the host gives up). It sits behind the
// fault proxy, so that it sees every answer the replica gave, whatever the
// network did to it afterwards.
type recorder struct {
	host, replica string // host "" is the campaign's own user client
	target        *url.URL
	tr            *http.Transport
	hist          *checker.Writer
	ln            net.Listener
	srv           *http.Server
	closed        chan struct{}
	// onJob is told every job a 2xx send_message answer names, whether
	// or not the answer reached the client.
	onJob func(id string)

	mu   sync.Mutex // guards drop and rng
	drop float64    // probability that a worker call's answer is withheld
	rng  *rand.Rand
}

func startRecorder(host, replica, target string, hist *checker.Writer, seed uint64) (*recorder, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &recorder{host: host, replica: replica, target: u, hist: hist, ln: ln, closed: make(chan struct{}),
		tr:  &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second, DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext},
		rng: rand.New(rand.NewPCG(seed, 0x5eed))}
	if host == "" {
		// The campaign's user: a fresh connection per request, so that a
		// replica's restart never turns a kept connection into a lost
		// answer (a message must not be sent twice, and has no key).
		r.tr.DisableKeepAlives = true
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// addr is where the fault proxy forwards to.
func (r *recorder) addr() string { return r.ln.Addr().String() }

// withhold sets the probability that a worker call's answer is withheld.
func (r *recorder) withhold(p float64) {
	r.mu.Lock()
	r.drop = p
	r.mu.Unlock()
}

func (r *recorder) dropNow(call string) bool {
	if call == checker.CallRead || r.host == "" {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drop > 0 && r.rng.Float64() < r.drop
}

func (r *recorder) close() {
	close(r.closed)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if r.srv.Shutdown(ctx) != nil {
		r.srv.Close()
	}
	r.tr.CloseIdleConnections()
}

// ServeHTTP forwards one request and records it.
func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	sent := time.Now()
	body, err := io.ReadAll(io.LimitReader(req.Body, wire.MaxBodyBytes+1))
	call, job := checker.CallOf(req.Method, req.URL.Path)
	rec := checker.Record{Host: r.host, Replica: r.replica, JobID: job,
		HTTP: &checker.HTTP{Method: req.Method, Path: req.URL.Path, Call: call, Sent: sent}}
	if checker.IsAttemptWrite(call) {
		var ref wire.AttemptRef
		if json.Unmarshal(body, &ref) == nil {
			rec.AttemptID, rec.LeaseGeneration = ref.AttemptID, ref.LeaseGeneration
		}
	}
	if err != nil {
		rec.HTTP.Error = "client"
		r.write(rec)
		hangUp(w)
		return
	}
	out, err := http.NewRequestWithContext(req.Context(), req.Method, r.target.String()+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		rec.HTTP.Error = "request"
		r.write(rec)
		hangUp(w)
		return
	}
	out.Header = req.Header.Clone()
	out.Header.Del("Connection")
	resp, err := r.tr.RoundTrip(out)
	var answer []byte
	if err == nil {
		answer, err = io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
	}
	if err != nil {
		// No answer from the replica: the host sees its connection
		// drop, as it would on the network; nothing is made up for it.
		rec.HTTP.Error = errClass(err)
		r.write(rec)
		var oe *net.OpError
		if r.host == "" && errors.As(err, &oe) && oe.Op == "dial" {
			// The campaign's user is told the request never left, as a
			// load balancer with no backend says, so that it may send
			// it to the other replica.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_ = json.NewEncoder(w).Encode(wire.ErrorBody{Code: codeUnreached, Message: "the replica could not be reached"})
			return
		}
		hangUp(w)
		return
	}
	now := time.Now()
	rec.HTTP.Answered, rec.HTTP.Status = &now, resp.StatusCode
	if resp.StatusCode >= 300 {
		var eb wire.ErrorBody
		if json.Unmarshal(answer, &eb) == nil {
			rec.HTTP.Code = eb.Code
		}
	} else if call == checker.CallSendMessage || call == checker.CallCreateConversation {
		var j struct {
			ID             string `json:"id"`
			ConversationID string `json:"conversation_id"`
		}
		if json.Unmarshal(answer, &j) == nil {
			if call == checker.CallSendMessage {
				rec.JobID, rec.ConversationID = j.ID, j.ConversationID
				if r.onJob != nil && resp.StatusCode < 300 && j.ID != "" {
					r.onJob(j.ID)
				}
			} else {
				rec.ConversationID = j.ID
			}
		}
	}
	recs := []checker.Record{rec}
	if call == checker.CallClaim && resp.StatusCode == http.StatusOK {
		recs = r.claimRecords(rec, answer)
	}
	if r.dropNow(call) {
		for _, rec := range recs {
			rec.HTTP.Withheld = true
			r.write(rec)
		}
		r.silence(w)
		return
	}
	for _, rec := range recs {
		r.write(rec)
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// claimRecords is the record of a claim's answer, one per claimed turn: a
// daemon with several free slots takes a batch ({"claims": […]}) in one
// answer, and each of its turns is its own attempt the checker must know.
// The worker tokens are read and forgotten: never recorded.
func (r *recorder) claimRecords(rec checker.Record, answer []byte) []checker.Record {
	var body struct {
		wire.Claim
		Claims []wire.Claim `json:"claims"`
	}
	if json.Unmarshal(answer, &body) != nil {
		return []checker.Record{rec}
	}
	claims := body.Claims
	if len(claims) == 0 {
		claims = []wire.Claim{body.Claim}
	}
	recs := make([]checker.Record, 0, len(claims))
	for _, c := range claims {
		one := rec
		if rec.HTTP != nil {
			h := *rec.HTTP
			one.HTTP = &h
		}
		one.JobID, one.AttemptID, one.LeaseGeneration, one.ConversationID = c.JobID, c.AttemptID, c.LeaseGeneration, c.Turn.ConversationID
		if r.onJob != nil && c.JobID != "" {
			r.onJob(c.JobID) // a job whose enqueuing answer was lost is known from its claim
		}
		recs = append(recs, one)
	}
	return recs
}

func (r *recorder) write(rec checker.Record) {
	_ = r.hist.Write(rec) // the first error is kept by the writer and reported at the end
}

// silence answers nothing: the connection stays open and silent until the
// client gives up on it (or the campaign ends).
func (r *recorder) silence(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return
	}
	c, _, err := hj.Hijack()
	if err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c) // ends when the client closes
		close(done)
	}()
	select {
	case <-done:
	case <-r.closed:
	}
	c.Close()
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
		}
	}
}

// errClass is a short class of a transport failure, never its free text.
func errClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "reset"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case strings.Contains(err.Error(), "no route to host"):
		return "unreachable"
	}
	return "error"
}
