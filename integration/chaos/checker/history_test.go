package checker

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

func TestCallOfNamesEveryWorkerCall(t *testing.T) {
	tests := []struct {
		method, path, call, job string
	}{
		{"POST", wire.PathClaim, CallClaim, ""},
		{"POST", wire.PathHostHeartbeat, CallHostHeartbeat, ""},
		{"POST", wire.PathConversations, CallConversations, ""},
		{"POST", wire.PathCancels, CallCancels, ""},
		{"POST", wire.AttemptPath("job_1", wire.OpRenew), wire.OpRenew, "job_1"},
		{"POST", wire.AttemptPath("job_1", wire.OpFinish), wire.OpFinish, "job_1"},
		{"POST", wire.AttemptPath("job_1", wire.OpRelease), wire.OpRelease, "job_1"},
		{"POST", wire.AttemptPath("job_1", "nonsense"), CallOther, ""},
		{"POST", "/v1/conversations", CallCreateConversation, ""},
		{"POST", "/v1/conversations/c1/messages", CallSendMessage, ""},
		{"POST", "/v1/jobs/job_2/cancel", CallCancelJob, "job_2"},
		{"POST", "/v1/admin/conversations/c1/lose", CallLoseConversation, ""},
		{"GET", "/v1/jobs/job_2", CallRead, ""},
	}
	for _, tt := range tests {
		call, job := CallOf(tt.method, tt.path)
		if call != tt.call || job != tt.job {
			t.Errorf("CallOf(%s %s) = %q, %q; want %q, %q", tt.method, tt.path, call, job, tt.call, tt.job)
		}
	}
	for _, op := range []string{wire.OpRenew, wire.OpEvents, wire.OpContainer, wire.OpAdmission,
		wire.OpSettlement, wire.OpNotices, wire.OpAbandon, wire.OpRelease, wire.OpFinish} {
		if !IsAttemptWrite(op) {
			t.Errorf("%s is not an attempt write", op)
		}
	}
}

// TestWriterReadRoundTrip: concurrent writers produce whole lines that Read
// gives back with their kinds and line numbers.
func TestWriterReadRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			if err := w.Write(Record{Time: at, Host: "h1", JobID: "j", HTTP: &HTTP{Method: "POST", Path: wire.PathClaim, Call: CallClaim, Sent: at, Answered: &at, Status: 200}}); err != nil {
				t.Error(err)
			}
			if err := w.Write(Record{Time: at, Host: "h1", Process: &Process{Role: RoleChild, Event: ProcessStart, PID: i}}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 100 {
		t.Fatalf("%d records, want 100", len(recs))
	}
	kinds := map[Kind]int{}
	for i, r := range recs {
		kinds[r.Kind]++
		if r.Line != i+1 {
			t.Fatalf("record %d has line %d", i, r.Line)
		}
	}
	if kinds[KindHTTP] != 50 || kinds[KindProcess] != 50 {
		t.Fatalf("kinds %v", kinds)
	}
}

func TestWriterRefusesAmbiguousRecords(t *testing.T) {
	w := NewWriter(&bytes.Buffer{})
	if err := w.Write(Record{}); err == nil {
		t.Fatal("a record with no payload was written")
	}
	if err := w.Write(Record{Prompt: &Prompt{}, Fault: &Fault{}}); err == nil {
		t.Fatal("a record with two payloads was written")
	}
	if err := w.Write(Record{Kind: KindFault, Prompt: &Prompt{}}); err == nil {
		t.Fatal("a record whose kind disagrees with its payload was written")
	}
	if _, err := Read(strings.NewReader(`{"kind":"fault","prompt":{"text":"x"}}` + "\n")); err == nil {
		t.Fatal("Read took a record whose kind disagrees with its payload")
	}
}
