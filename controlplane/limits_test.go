package controlplane_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// Limits: POST /v1/conversations refuses limits it cannot keep, on both
// stores, as bad input and never as a failure of the control plane: a
// negative figure, an unknown key, a figure over a sane bound (400
// invalid or unknown_field); disk_bytes, and limits of a process
// conversation, are 400 unsupported with a message that says why. Good
// limits are stored and answered; a conversation's GET shows them.
func TestConversationLimitsBadInput(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			f := newFixtureOn(t, sc.db(t))
			body := func(limits string) string {
				return `{"image":"i","agent_command":["a"],"limits":` + limits + `}`
			}
			for _, tc := range []struct {
				name, body, code, says string
			}{
				{"negative memory", body(`{"memory_bytes":-1}`), wire.CodeInvalid, "limits.memory_bytes"},
				{"negative pids", body(`{"pids":-1}`), wire.CodeInvalid, "limits.pids"},
				{"negative cpus", body(`{"cpus":-2}`), wire.CodeInvalid, "limits.cpus"},
				{"an unknown key", body(`{"gpus":1}`), wire.CodeUnknownField, "field"},
				{"memory over 1 TiB", body(`{"memory_bytes":1099511627777}`), wire.CodeInvalid, "limits.memory_bytes"},
				{"memory under 6 MiB", body(`{"memory_bytes":4096}`), wire.CodeInvalid, "limits.memory_bytes"},
				{"cpus over the bound", body(`{"cpus":5000}`), wire.CodeInvalid, "limits.cpus"},
				{"pids over the bound", body(`{"pids":99999999}`), wire.CodeInvalid, "limits.pids"},
				{"pids not an integer", body(`{"pids":1.5}`), wire.CodeBadJSON, ""},
				{"disk_bytes", body(`{"disk_bytes":1073741824}`), wire.CodeUnsupported, "no quota"},
				{"limits of a process conversation", `{"image":"i","agent_command":["a"],"sandbox":"process","limits":{"pids":8}}`,
					wire.CodeUnsupported, "process backend"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					status, b := f.do("POST", "/v1/conversations", userToken, tc.body)
					if status != http.StatusBadRequest || code(b) != tc.code {
						t.Fatalf("HTTP %d %q, want 400 %q (body %s)", status, code(b), tc.code, b)
					}
					var eb wire.ErrorBody
					if err := json.Unmarshal(b, &eb); err != nil || !strings.Contains(eb.Message, tc.says) {
						t.Fatalf("refusal %s does not say %q", b, tc.says)
					}
				})
			}
			b := f.expect("POST", "/v1/conversations", userToken, body(`{"cpus":0.5,"memory_bytes":268435456,"pids":32}`), http.StatusCreated, "")
			var c wire.Conversation
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatal(err)
			}
			want := wire.Limits{CPUs: 0.5, MemoryBytes: 256 << 20, Pids: 32}
			if c.Limits != want {
				t.Fatalf("created with limits %+v, want %+v", c.Limits, want)
			}
			var got wire.Conversation
			if err := json.Unmarshal(f.expect("GET", "/v1/conversations/"+c.ID, userToken, "", http.StatusOK, ""), &got); err != nil || got.Limits != want {
				t.Fatalf("GET shows limits %+v (%v), want %+v", got.Limits, err, want)
			}
			if strings.Contains(f.logs.String(), "controlplane_request_failed") {
				t.Fatalf("a bad limit was recorded as a failure of the control plane:\n%s", f.logs.String())
			}
		})
	}
}
