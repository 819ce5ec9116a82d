package runner

import "testing"

// An http:// control plane on another host is warned about at start;
// loopback and https:// are not.
func TestPlainRemoteControlPlane(t *testing.T) {
	for url, want := range map[string]bool{
		"http://cp.example:8080":     true,
		"http://10.0.0.5:8080":       true,
		"http://[2001:db8::1]:8080":  true,
		"http://127.0.0.1:8080":      false,
		"http://127.0.0.2:8080":      false,
		"http://[::1]:8080":          false,
		"http://localhost:8080":      false,
		"http://cp.localhost:8080":   false,
		"https://cp.example:8443":    false,
		"https://127.0.0.1:8443/cp/": false,
	} {
		if got := plainRemote(url); got != want {
			t.Errorf("plainRemote(%q) = %v, want %v", url, got, want)
		}
	}
}
