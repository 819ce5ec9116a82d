package controlplane

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// FuzzDecodeJSON feeds outside bytes to the strict decoder as every
// request type the server reads. It must never panic; a refusal is a
// decoding refusal or a 400 invalid (a field no store can keep) and never
// echoes the input; an accepted body is exactly one JSON object of known
// fields, with no NUL character in any string, which survives a round trip.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, ``, `null`, `[]`, `{"attempt_id":"a","lease_generation":1}`,
		`{"attempt_id":"a","lease_generation":1,"events":[{"seq":1,"time":"2026-11-29T12:00:00Z","type":"x","data":{"k":[1,2]}}]}`,
		`{"wait_ms":30000,"lease_ttl_ms":120000}`, `{"nope":1}`, `{} {}`, `{}x`, `{"a":`, "\xff",
		`{"attempt_id":"a","attempt_id":"b"}`, `{"ATTEMPT_ID":"a"}`, `{"capacity":1e400}`,
		`{"launch_error":{"class":"c","consecutive":1,"since":"2026-11-29T12:00:00Z"}}`,
		`{"supervisor_receipt":{"activation_id":"a","receipt_id":"r","native_turn":-1,"exit_code":0}}`,
		`{"conversation_ids":["conv_a","conv_b",""]}`, `{"conversation_ids":null}`,
		` null `, `"text"`, `{"prompt":"a\u0000b"}`, `{"agent_command":["a","\u0000"]}`,
		`{"events":[{"seq":1,"type":"t","time":"3000-01-01T00:00:00Z"}]}`, "{\"events\":[{\"data\":\"\xff\"}]}",
		`{"launch_error":{"class":"c","consecutive":1,"since":"1600-01-01T00:00:00Z"}}`, `{"version":"\u0000"}`,
		`{"events":[{"data":{"k":["\u0000"]}}]}`, `{"events":[{"data":"\\u0000"}]}`,
	} {
		f.Add([]byte(s))
	}
	targets := []func() any{
		func() any { return new(wire.ClaimRequest) },
		func() any { return new(wire.HostHeartbeat) },
		func() any { return new(wire.ConversationStatesRequest) },
		func() any { return new(wire.RenewRequest) },
		func() any { return new(wire.EventsRequest) },
		func() any { return new(wire.ContainerRequest) },
		func() any { return new(wire.AdmissionRequest) },
		func() any { return new(wire.SettlementRequest) },
		func() any { return new(wire.NoticeRequest) },
		func() any { return new(wire.AbandonRequest) },
		func() any { return new(wire.ReleaseRequest) },
		func() any { return new(wire.FinishRequest) },
		func() any { return new(wire.CreateConversationRequest) },
		func() any { return new(wire.SendMessageRequest) },
	}
	refusals := map[*apiError]bool{errEmptyBody: true, errBadJSON: true, errNotObject: true, errTrailingData: true,
		errUnknownField: true, errBodyTooLarge: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newDst := range targets {
			dst := newDst()
			e := decodeJSON(http.MaxBytesReader(nil, body(data), wire.MaxBodyBytes), dst)
			if e != nil {
				if !refusals[e] && e.code != wire.CodeInvalid {
					t.Fatalf("refusal %+v is not a decoding refusal", e)
				}
				if e.status != http.StatusBadRequest {
					t.Fatalf("refusal status %d", e.status)
				}
				if len(data) >= 4 && strings.Contains(e.message, string(data)) {
					t.Fatalf("refusal %q echoes the body", e.message)
				}
				continue
			}
			if !json.Valid(data) {
				t.Fatalf("accepted invalid JSON %q", data)
			}
			if d := bytes.TrimLeft(data, " \t\r\n"); len(d) == 0 || d[0] != '{' {
				t.Fatalf("accepted %q, which is not an object", data)
			}
			if acceptedNUL(t, dst) {
				t.Fatalf("accepted a NUL character into %T: %q", dst, data)
			}
			out, err := json.Marshal(dst)
			if err != nil {
				t.Fatalf("re-encode %T: %v", dst, err)
			}
			again := newDst()
			if e := decodeJSON(body(out), again); e != nil {
				t.Fatalf("re-decode %s as %T: %v", out, dst, e)
			}
			if !reflect.DeepEqual(normalize(t, dst), normalize(t, again)) {
				t.Fatalf("round trip of %T changed it: %s", dst, out)
			}
		}
	})
}

// acceptedNUL reports whether any string of v, as JSON, holds U+0000
// (raw JSON fields included: they are decoded too).
func acceptedNUL(t *testing.T, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var walk func(any) bool
	walk = func(x any) bool {
		switch x := x.(type) {
		case string:
			return strings.ContainsRune(x, 0)
		case []any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		case map[string]any:
			for k, e := range x {
				if strings.ContainsRune(k, 0) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		t.Fatal(err)
	}
	return walk(x)
}

func body(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

// normalize compares two decoded values by their encoding, since raw JSON
// fields keep the input's spacing.
func normalize(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil {
		t.Fatal(err)
	}
	return c.String()
}

// The oversize refusal is hard to reach by fuzzing; check it directly.
func TestDecodeOversize(t *testing.T) {
	s := `{"prompt":"` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`
	var dst wire.SendMessageRequest
	if e := decodeJSON(http.MaxBytesReader(nil, body([]byte(s)), wire.MaxBodyBytes), &dst); e != errBodyTooLarge {
		t.Fatalf("oversize body: %v, want body_too_large", e)
	}
	s = `{"prompt":"` + strings.Repeat("x", wire.MaxBodyBytes-20) + `"}`
	if e := decodeJSON(http.MaxBytesReader(nil, body([]byte(s)), wire.MaxBodyBytes), &dst); e != nil {
		t.Fatalf("body just under the limit: %v", e)
	}
}
