package controlplane_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

// Bad input is refused as bad input (400), on both stores, and never
// answered 503 "try again" (which would never succeed), never taken as
// something else, never redirected: a NUL character in any string that
// would reach the store, a path with NUL or ".." segments, a lease that
// overflows time.Duration, a heartbeat without its fields, a null body.
// After each refusal the server still works, and nothing was recorded as
// a failure of the control plane.
func TestBadInputRefused(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			f := newFixtureOn(t, sc.db(t))
			conv := f.newConversation()
			f.send(conv.ID, "hello")
			c := f.claim()
			job := func(op string) string { return wire.AttemptPath(c.JobID, op) }
			attempt := fmt.Sprintf(`"attempt_id":%q,"lease_generation":%d`, c.AttemptID, c.LeaseGeneration)
			const huge = "9223372036854" // × 1 ms overflows time.Duration to a lease inside the bounds

			cases := []struct {
				name, method, path, token, body string
				status                          int
				code                            string
			}{
				{"NUL in a prompt", "POST", "/v1/conversations/" + conv.ID + "/messages", userToken,
					`{"prompt":"a\u0000b"}`, 400, wire.CodeInvalid},
				{"NUL in a title", "POST", "/v1/conversations", userToken,
					`{"title":"t\u0000","image":"i","agent_command":["a"]}`, 400, wire.CodeInvalid},
				{"NUL in an agent command", "POST", "/v1/conversations", userToken,
					`{"image":"i","agent_command":["a","\u0000"]}`, 400, wire.CodeInvalid},
				{"NUL in an event type", "POST", job(wire.OpEvents), c.WorkerToken,
					`{` + attempt + `,"events":[{"seq":1,"type":"x\u0000"}]}`, 400, wire.CodeInvalid},
				{"bytes not UTF-8 in event data", "POST", job(wire.OpEvents), c.WorkerToken,
					`{` + attempt + `,"events":[{"seq":1,"type":"x","data":{"k":"` + "\xff\xfe" + `"}}]}`, 400, wire.CodeInvalid},
				{"an escaped NUL in event data", "POST", job(wire.OpEvents), c.WorkerToken,
					`{` + attempt + `,"events":[{"seq":1,"type":"x","data":{"k":["\u0000"]}}]}`, 400, wire.CodeInvalid},
				{"event time past what the store keeps", "POST", job(wire.OpEvents), c.WorkerToken,
					`{` + attempt + `,"events":[{"seq":1,"type":"x","time":"3000-01-01T00:00:00Z"}]}`, 400, wire.CodeInvalid},
				{"NUL in a container id", "POST", job(wire.OpContainer), c.WorkerToken,
					`{` + attempt + `,"backend":"process","container_id":"c\u0000"}`, 400, wire.CodeInvalid},
				{"a requirement key routing cannot keep", "POST", "/v1/conversations", userToken,
					`{"image":"i","agent_command":["a"],"requires":{"GPU,x":"a"}}`, 400, wire.CodeInvalid},
				{"an unknown sandbox", "POST", "/v1/conversations", userToken,
					`{"image":"i","agent_command":["a"],"sandbox":"vm"}`, 400, wire.CodeInvalid},
				{"a heartbeat label value with a comma", "POST", wire.PathHostHeartbeat, f.hostToken,
					`{"capacity":1,"running":0,"draining":false,"labels":{"zone":"a,b"}}`, 400, wire.CodeInvalid},
				{"NUL in a heartbeat version", "POST", wire.PathHostHeartbeat, f.hostToken,
					`{"capacity":1,"running":0,"draining":false,"version":"v\u0000"}`, 400, wire.CodeInvalid},
				{"NUL in a conversation id asked about", "POST", wire.PathConversations, f.hostToken,
					`{"conversation_ids":["conv_\u0000"]}`, 400, wire.CodeInvalid},
				{"NUL in a path", "GET", "/v1/jobs/job_%00", userToken, "", 400, wire.CodeInvalid},
				{"NUL in a conversation path", "POST", "/v1/conversations/%00/messages", userToken,
					`{"prompt":"p"}`, 400, wire.CodeInvalid},
				{"bytes not UTF-8 in a path", "GET", "/v1/conversations/%FF", userToken, "", 400, wire.CodeInvalid},
				{"a path with ../", "POST", "/v1/jobs/x/../" + c.JobID + "/cancel", userToken, "", 400, wire.CodeInvalid},
				{"a path with //", "GET", "/v1//jobs/" + c.JobID, userToken, "", 400, wire.CodeInvalid},
				{"lease_ttl_ms that overflows, claim", "POST", wire.PathClaim, f.hostToken,
					`{"lease_ttl_ms":` + huge + `}`, 400, wire.CodeInvalid},
				{"lease_ttl_ms that overflows, renew", "POST", job(wire.OpRenew), c.WorkerToken,
					`{` + attempt + `,"lease_ttl_ms":` + huge + `}`, 400, wire.CodeInvalid},
				{"heartbeat {}", "POST", wire.PathHostHeartbeat, f.hostToken, `{}`, 400, wire.CodeInvalid},
				{"heartbeat without draining", "POST", wire.PathHostHeartbeat, f.hostToken,
					`{"capacity":1,"running":0}`, 400, wire.CodeInvalid},
				{"launch_error without since", "POST", wire.PathHostHeartbeat, f.hostToken,
					`{"capacity":1,"running":0,"draining":false,"launch_error":{"class":"spawn_failed","consecutive":2}}`, 400, wire.CodeInvalid},
				{"null body, user call", "POST", "/v1/conversations", userToken, `null`, 400, wire.CodeBadJSON},
				{"null body, host call", "POST", wire.PathHostHeartbeat, f.hostToken, `null`, 400, wire.CodeBadJSON},
				{"null body, attempt call", "POST", job(wire.OpRenew), c.WorkerToken, ` null `, 400, wire.CodeBadJSON},
				{"an array body", "POST", wire.PathClaim, f.hostToken, `[]`, 400, wire.CodeBadJSON},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					got, b := f.do(tc.method, tc.path, tc.token, tc.body)
					if got != tc.status || code(b) != tc.code {
						t.Fatalf("HTTP %d %q, want %d %q (body %s)", got, code(b), tc.status, tc.code, b)
					}
					if strings.Contains(string(b), "\\u0000") || strings.Contains(string(b), "\x00") {
						t.Fatalf("the refusal echoes the input: %s", b)
					}
				})
			}

			// The same calls done right are accepted: what was refused was
			// the input, not the server.
			f.expect("POST", wire.PathHostHeartbeat, f.hostToken,
				`{"capacity":1,"running":0,"draining":false,"launch_error":{"class":"spawn_failed","consecutive":2,"since":"2026-11-29T12:00:00Z"},"version":"v1"}`,
				http.StatusOK, "")
			f.expect("POST", job(wire.OpRenew), c.WorkerToken, `{`+attempt+`,"lease_ttl_ms":60000}`, http.StatusOK, "")
			f.expect("POST", job(wire.OpEvents), c.WorkerToken,
				`{`+attempt+`,"events":[{"seq":1,"type":"x","data":{"k":"é"}}]}`, http.StatusOK, "")
			f.expect("GET", "/v1/jobs/"+c.JobID, userToken, "", http.StatusOK, "")
			if strings.Contains(f.logs.String(), "controlplane_request_failed") {
				t.Fatalf("a bad input was recorded as a failure of the control plane:\n%s", f.logs.String())
			}
		})
	}
}
