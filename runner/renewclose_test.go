package runner

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// The renewer's CloseIdleConnections reaches the renewal transport's pool
// through every wrapper the daemon puts around it (the renewal counter,
// the control-plane addresses): an idle renewal connection is closed.
func TestRenewalClientClosesIdleConnections(t *testing.T) {
	closed := make(chan struct{}, 1)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == wire.PathWorkerBatch {
			w.WriteHeader(http.StatusNotFound) // an older control plane: renewals go per call
			return
		}
		w.Write([]byte(`{}`))
	}))
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	hs.Start()
	defer hs.Close()
	c := newCP(t)
	d, _ := newTestDaemon(t, c, func(cfg *Config) { cfg.ControlPlaneURL = hs.URL })
	if _, err := d.renew.Renew(context.Background(), "rdw_x", "job", wire.RenewRequest{}); err != nil {
		t.Fatalf("renew: %v", err)
	}
	select {
	case <-closed:
		t.Fatal("the connection closed before it was asked to")
	default:
	}
	d.renew.HTTP.CloseIdleConnections()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle renewal connection is still open: CloseIdleConnections was swallowed")
	}
}
