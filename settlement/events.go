package settlement

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Defaults of EventsConfig.
const (
	DefaultEventBuffer    = 1024
	DefaultEventBatch     = 100
	DefaultEventBatchSize = 256 << 10
	DefaultEventFlush     = 10 * time.Second
)

// EventsConfig bounds event upload. Zero fields mean the defaults.
type EventsConfig struct {
	// Buffer is how many events wait for upload; more are dropped and counted.
	Buffer int
	// Batch and BatchBytes bound one upload (the control plane reads at
	// most wire.MaxBodyBytes).
	Batch      int
	BatchBytes int
	// Flush bounds how long Finish waits for pending events before it
	// reports anyway (R21).
	Flush time.Duration
}

func (c EventsConfig) withDefaults() EventsConfig {
	if c.Buffer <= 0 {
		c.Buffer = DefaultEventBuffer
	}
	if c.Batch <= 0 {
		c.Batch = DefaultEventBatch
	}
	if c.BatchBytes <= 0 {
		c.BatchBytes = DefaultEventBatchSize
	}
	if c.Flush <= 0 {
		c.Flush = DefaultEventFlush
	}
	return c
}

// Event queues an error or stream event for upload and returns at once.
// Each kept event gets the next sequence number of the attempt, so a batch
// repeated after a lost answer is harmless. When the buffer is full, or
// after Finish or a lease rejection, the event is dropped (false) and the
// drop counted in an agent_events_dropped record. It never blocks and
// never fails the turn.
func (s *Session) Event(typ string, data json.RawMessage) bool {
	return s.ev.add(typ, data, s.Rejected())
}

// FlushEvents closes the event buffer (later events are dropped and
// counted), gives the pending ones until EventsConfig.Flush or the end of
// ctx to reach the control plane, and stops the uploader. Finish does the
// same; a turn child whose daemon sends the terminal report calls it
// before handing over its result. It never fails: what is not uploaded by
// then is counted in an agent_events_dropped record.
func (s *Session) FlushEvents(ctx context.Context) { s.ev.flush(ctx) }

// uploader owns the event buffer and the one goroutine that uploads it.
type uploader struct {
	s      *Session
	cancel context.CancelFunc
	wake   chan struct{} // an event arrived (capacity 1)
	drain  chan struct{} // closed by flush: upload what is pending, then stop
	done   chan struct{} // closed when run returns

	mu        sync.Mutex
	buf       []wire.Event // pending, by sequence
	next      int64
	closed    bool
	dropped   int64 // total
	dropping  bool  // in a run of drops (one record per run)
	recorded  int64 // dropped count last recorded
	drainOnce sync.Once
	stopOnce  sync.Once
}

func startUploader(s *Session) *uploader {
	ctx, cancel := context.WithCancel(context.Background())
	u := &uploader{
		s: s, cancel: cancel,
		wake: make(chan struct{}, 1), drain: make(chan struct{}), done: make(chan struct{}),
	}
	go u.run(ctx)
	return u
}

func (u *uploader) add(typ string, data json.RawMessage, rejected bool) bool {
	u.mu.Lock()
	if u.closed || rejected || len(u.buf) >= u.s.cfg.Events.Buffer {
		u.dropped++
		first := !u.dropping
		u.dropping = true
		n := u.dropped
		if first {
			u.recorded = n
		}
		u.mu.Unlock()
		if first {
			u.s.rec.EventsDropped(context.Background(), u.s.attempt(), n)
		}
		return false
	}
	u.dropping = false
	u.next++
	u.buf = append(u.buf, wire.Event{Seq: u.next, Time: time.Now(), Type: typ, Data: data})
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
	return true
}

// batch returns the oldest pending events within the batch bounds (at
// least one); they stay pending until the control plane has stored them.
func (u *uploader) batch() []wire.Event {
	u.mu.Lock()
	defer u.mu.Unlock()
	cfg := u.s.cfg.Events
	size := 0
	n := 0
	for n < len(u.buf) && n < cfg.Batch {
		size += len(u.buf[n].Data) + len(u.buf[n].Type) + 64
		if n > 0 && size > cfg.BatchBytes {
			break
		}
		n++
	}
	return append([]wire.Event(nil), u.buf[:n]...)
}

func (u *uploader) ack(through int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	i := 0
	for i < len(u.buf) && u.buf[i].Seq <= through {
		i++
	}
	u.buf = u.buf[i:]
}

func (u *uploader) draining() bool {
	select {
	case <-u.drain:
		return true
	default:
		return false
	}
}

// run uploads until cancelled, or until a flush finds nothing pending or
// fails once. One failed upload per outage is recorded; retries follow the
// policy's Wait.
func (u *uploader) run(ctx context.Context) {
	defer close(u.done)
	s := u.s
	failing := false
	for {
		evs := u.batch()
		if len(evs) == 0 {
			if u.draining() {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-u.drain:
			case <-u.wake:
			}
			continue
		}
		var resp wire.EventsResponse
		err := s.rep.do(ctx, &write{op: wire.OpEvents, policy: uploadPolicy(s.cfg.Receipts), every: true, quiet: failing}, func(ctx context.Context, wc *wire.Client) error {
			var err error
			resp, err = wc.Events(ctx, s.cfg.WorkerToken, s.cfg.JobID, wire.EventsRequest{AttemptRef: s.cfg.Attempt, Events: evs})
			return err
		})
		if err == nil {
			u.ack(resp.StoredThrough)
			failing = false
			continue
		}
		if s.Rejected() || ctx.Err() != nil || u.draining() {
			return
		}
		failing = true
		t := time.NewTimer(s.cfg.Receipts.Wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-u.drain:
			t.Stop()
		case <-t.C:
		}
	}
}

// flush closes the buffer and gives pending events until Events.Flush to
// reach the control plane, then stops the uploader.
func (u *uploader) flush(ctx context.Context) {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	u.drainOnce.Do(func() { close(u.drain) })
	t := time.NewTimer(u.s.cfg.Events.Flush)
	defer t.Stop()
	select {
	case <-u.done:
	case <-t.C:
	case <-ctx.Done():
	}
	u.stop()
}

// stop cancels the uploader, waits for it, and records the drops not yet
// recorded, counting the events it never uploaded. It answers how many
// events were dropped in all.
func (u *uploader) stop() int64 {
	u.stopOnce.Do(func() {
		u.mu.Lock()
		u.closed = true
		u.mu.Unlock()
		u.cancel()
		<-u.done
		u.mu.Lock()
		u.dropped += int64(len(u.buf)) // never uploaded: lost with the process
		u.buf = nil
		n, rec := u.dropped, u.recorded
		u.recorded = n
		u.mu.Unlock()
		if n > rec {
			u.s.rec.EventsDropped(context.Background(), u.s.attempt(), n)
		}
	})
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.dropped
}
