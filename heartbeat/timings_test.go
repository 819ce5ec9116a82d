package heartbeat_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
)

// R12: the lease must be at least one interval plus one request timeout
// (40 s at the defaults). A shorter --lease-ttl is refused; a shorter
// AGENT_LEASE_TTL is ignored for the default with a warning.
func TestR12LeaseTTLMatrix(t *testing.T) {
	const s = time.Second
	tests := []struct {
		name    string
		in      heartbeat.TimingInputs
		ttl     time.Duration // want, when no error
		warned  time.Duration // Given of the one warning; -1 none
		errWant string        // substring of the error; "" none
	}{
		{"defaults", heartbeat.TimingInputs{}, 120 * s, -1, ""},
		{"flag shorter than 40s", heartbeat.TimingInputs{LeaseTTLFlag: 39 * s, LeaseTTLFlagSet: true}, 0, -1, "--lease-ttl 39s is shorter"},
		{"flag equal to 40s", heartbeat.TimingInputs{LeaseTTLFlag: 40 * s, LeaseTTLFlagSet: true}, 40 * s, -1, ""},
		{"flag longer than 40s", heartbeat.TimingInputs{LeaseTTLFlag: 90 * s, LeaseTTLFlagSet: true}, 90 * s, -1, ""},
		{"flag zero", heartbeat.TimingInputs{LeaseTTLFlag: 0, LeaseTTLFlagSet: true}, 0, -1, "--lease-ttl 0s is shorter"},
		{"env shorter than 40s", heartbeat.TimingInputs{LeaseTTLEnv: "39"}, 120 * s, 39 * s, ""},
		{"env shorter as duration", heartbeat.TimingInputs{LeaseTTLEnv: "20s"}, 120 * s, 20 * s, ""},
		{"env equal to 40s", heartbeat.TimingInputs{LeaseTTLEnv: "40"}, 40 * s, -1, ""},
		{"env longer than 40s", heartbeat.TimingInputs{LeaseTTLEnv: "3m"}, 180 * s, -1, ""},
		{"env unreadable", heartbeat.TimingInputs{LeaseTTLEnv: "soon"}, 120 * s, 0, ""},
		{"env negative", heartbeat.TimingInputs{LeaseTTLEnv: "-90"}, 120 * s, 0, ""},
		{"env over a day", heartbeat.TimingInputs{LeaseTTLEnv: "25h"}, 120 * s, 0, ""},
		{"flag wins over short env", heartbeat.TimingInputs{LeaseTTLFlag: 60 * s, LeaseTTLFlagSet: true, LeaseTTLEnv: "10"}, 60 * s, -1, ""},
		{"short flag refused despite good env", heartbeat.TimingInputs{LeaseTTLFlag: 30 * s, LeaseTTLFlagSet: true, LeaseTTLEnv: "90"}, 0, -1, "--lease-ttl 30s is shorter"},
		{"longer interval raises the minimum", heartbeat.TimingInputs{Interval: 50 * s, LeaseTTLFlag: 55 * s, LeaseTTLFlagSet: true}, 0, -1, "50s + 10s = 1m0s"},
		{"longer interval, env below it", heartbeat.TimingInputs{Interval: 50 * s, LeaseTTLEnv: "55"}, 120 * s, 55 * s, ""},
		{"interval too long for the default lease", heartbeat.TimingInputs{Interval: 115 * s}, 0, -1, "default lease 2m0s is shorter"},
		{"shorter interval and timeout allow a shorter lease", heartbeat.TimingInputs{Interval: 20 * s, RequestTimeout: 5 * s, RetryDelay: 2 * s, LeaseTTLEnv: "25"}, 25 * s, -1, ""},
		{"negative interval", heartbeat.TimingInputs{Interval: -s}, 0, -1, "--renew-interval -1s: must be positive"},
		{"negative timeout", heartbeat.TimingInputs{RequestTimeout: -s}, 0, -1, "--renew-timeout"},
		{"negative retry", heartbeat.TimingInputs{RetryDelay: -s}, 0, -1, "--renew-retry"},
		{"retry longer than interval", heartbeat.TimingInputs{RetryDelay: 31 * s}, 0, -1, "--renew-retry 31s is longer than --renew-interval 30s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warnings, err := heartbeat.ResolveTimings(tt.in)
			if tt.errWant != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errWant) {
					t.Fatalf("error %v, want one containing %q", err, tt.errWant)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.LeaseTTL != tt.ttl {
				t.Fatalf("lease %v, want %v", got.LeaseTTL, tt.ttl)
			}
			if got.LeaseTTL < got.Interval+got.RequestTimeout {
				t.Fatalf("resolved %+v breaks R12", got)
			}
			switch {
			case tt.warned < 0 && len(warnings) != 0:
				t.Fatalf("warnings %+v, want none", warnings)
			case tt.warned >= 0 && (len(warnings) != 1 || warnings[0].Given != tt.warned || warnings[0].Setting != heartbeat.EnvLeaseTTL || warnings[0].Used != heartbeat.DefaultLeaseTTL):
				t.Fatalf("warnings %+v, want one for %s given %v", warnings, heartbeat.EnvLeaseTTL, tt.warned)
			}
		})
	}
}

// R12: the daemon logs each warning as agent_config_ignored; the record
// never carries the raw environment text.
func TestR12WarningRecord(t *testing.T) {
	_, warnings, err := heartbeat.ResolveTimings(heartbeat.TimingInputs{LeaseTTLEnv: "10s"})
	if err != nil || len(warnings) != 1 {
		t.Fatalf("warnings %v, err %v", warnings, err)
	}
	var buf bytes.Buffer
	rec := diagnostics.NewRecorder(slog.New(slog.NewJSONHandler(&buf, nil)))
	w := warnings[0]
	rec.ConfigIgnored(context.Background(), w.Setting, w.Given, w.Used, w.Reason)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["msg"] != diagnostics.MsgConfigIgnored || m[diagnostics.KeySetting] != "AGENT_LEASE_TTL" ||
		m[diagnostics.KeyGiven] != float64(10_000) || m[diagnostics.KeyUsed] != float64(120_000) || m["level"] != "WARN" {
		t.Fatalf("record %v", m)
	}
}

// R1–R4 defaults.
func TestDefaults(t *testing.T) {
	got, _, err := heartbeat.ResolveTimings(heartbeat.TimingInputs{})
	want := heartbeat.Timings{LeaseTTL: 120 * time.Second, Interval: 30 * time.Second, RequestTimeout: 10 * time.Second, RetryDelay: 5 * time.Second}
	if err != nil || got != want {
		t.Fatalf("defaults %+v (%v), want %+v", got, err, want)
	}
	if got.MinLeaseTTL() != 40*time.Second {
		t.Fatalf("minimum lease %v, want 40s", got.MinLeaseTTL())
	}
}

// AGENT_LEASE_TTL is outside input: whatever it says, start-up never fails
// because of it, the lease honours R12, and a rejected value leaves one
// warning and the default.
func FuzzResolveTimingsEnv(f *testing.F) {
	for _, s := range []string{"", "40", "39", "120s", "2m", "-5", "0", "1e9", "9223372036854775807", "100000h", " 90 ", "90ms", "soon", "1h1m1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, env string) {
		got, warnings, err := heartbeat.ResolveTimings(heartbeat.TimingInputs{LeaseTTLEnv: env})
		if err != nil {
			t.Fatalf("env %q made start-up fail: %v", env, err)
		}
		if got.LeaseTTL < got.MinLeaseTTL() {
			t.Fatalf("env %q gave lease %v", env, got.LeaseTTL)
		}
		if len(warnings) > 1 || len(warnings) == 1 && got.LeaseTTL != heartbeat.DefaultLeaseTTL {
			t.Fatalf("env %q: lease %v, warnings %+v", env, got.LeaseTTL, warnings)
		}
	})
}
