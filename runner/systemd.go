package runner

// notifier is the daemon's view of the service manager (systemd's
// sd_notify). cmd gives it a real one when NOTIFY_SOCKET is set; nil
// means none.
type Notifier interface {
	Notify(state string) error
}

// sd_notify states the daemon sends.
const (
	notifyReady    = "READY=1"
	notifyWatchdog = "WATCHDOG=1"
	notifyStopping = "STOPPING=1"
)
