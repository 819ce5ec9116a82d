package wire

import (
	"testing"
	"time"
)

// A host is offline once OfflineAfterIntervals of its own heartbeat
// intervals passed without a heartbeat (DefaultHeartbeatInterval when it
// said none), or before its first; offline beats what it last said
// (draining, paused); otherwise draining beats paused beats online.
func TestHostState(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	paused := ago(time.Hour)
	for _, tc := range []struct {
		name string
		s    Server
		want string
	}{
		{"never heartbeated", Server{}, HostOffline},
		{"fresh", Server{LastHeartbeat: ago(time.Second)}, HostOnline},
		{"at three default intervals", Server{LastHeartbeat: ago(3 * DefaultHeartbeatInterval)}, HostOnline},
		{"past three default intervals", Server{LastHeartbeat: ago(3*DefaultHeartbeatInterval + time.Millisecond)}, HostOffline},
		{"its own interval", Server{LastHeartbeat: ago(50 * time.Second), HeartbeatIntervalMS: 20_000}, HostOnline},
		{"past its own interval", Server{LastHeartbeat: ago(61 * time.Second), HeartbeatIntervalMS: 20_000}, HostOffline},
		{"draining", Server{LastHeartbeat: ago(time.Second), Draining: true, PausedAt: paused}, HostDraining},
		{"paused", Server{LastHeartbeat: ago(time.Second), PausedAt: paused}, HostPaused},
		{"stopped while draining and paused", Server{LastHeartbeat: ago(5 * time.Minute), Draining: true, PausedAt: paused}, HostOffline},
	} {
		if got := HostState(tc.s, now); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
