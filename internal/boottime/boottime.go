// Package boottime is the host's lease clock: CLOCK_BOOTTIME, the time since
// boot that every process of the host reads from the same kernel — the
// daemon, a turn child and a container's supervisor alike — and that, unlike
// Go's monotonic clock (CLOCK_MONOTONIC), keeps counting while the machine is
// suspended. A lease deadline is an Instant of it, so it can travel down the
// process tree (handover payload, DEADLINE frames, the supervisor's
// protocol) and mean the same moment at every level.
//
// Clock is the small source the renewer counts with: System in production,
// Since in a testing/synctest bubble (derived from time.Now, which the bubble
// fakes). Alarm waits for an instant of CLOCK_BOOTTIME itself (a timerfd), so
// a deadline that passed during a suspend fires on resume, not a suspend
// later.
//
// boottime imports nothing of this module; anything may import it.
package boottime

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Instant is a reading of CLOCK_BOOTTIME in nanoseconds. Zero means "none".
type Instant int64

// Now reads CLOCK_BOOTTIME.
func Now() Instant {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; without it nothing
		// here can keep a lease honest.
		panic("boottime: clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return Instant(ts.Nano())
}

// Add is i moved by d.
func (i Instant) Add(d time.Duration) Instant { return i + Instant(d) }

// Sub is the duration i-j.
func (i Instant) Sub(j Instant) time.Duration { return time.Duration(i - j) }

// Before reports whether i is earlier than j.
func (i Instant) Before(j Instant) bool { return i < j }

// IsZero reports whether i is the zero Instant ("none").
func (i Instant) IsZero() bool { return i == 0 }

// String is the instant as seconds since boot, for records.
func (i Instant) String() string {
	return strconv.FormatFloat(time.Duration(i).Seconds(), 'f', 3, 64) + "s"
}

// Clock is a source of Instants.
type Clock interface{ Now() Instant }

// System is CLOCK_BOOTTIME itself.
type System struct{}

// Now reads CLOCK_BOOTTIME.
func (System) Now() Instant { return Now() }

// Since is a Clock that counts time.Now from base (its zero Instant is one
// nanosecond before base, so no reading is "none"). In a testing/synctest
// bubble it runs on the bubble's fake time, as the bubble's timers do.
type Since time.Time

// Now is the time since base as an Instant.
func (s Since) Now() Instant { return Instant(time.Since(time.Time(s))) + 1 }

// FromTime converts t, a reading of time.Now (with its monotonic clock), to
// an Instant of c: c's now minus the time elapsed since t.
func FromTime(c Clock, t time.Time) Instant { return c.Now().Add(-time.Since(t)) }

// Alarm fires when CLOCK_BOOTTIME reaches the instant it was last set to. It
// is a timerfd armed with an absolute time, so it fires on time across a
// suspend. Set may be called any number of times; C delivers at most one
// pending firing. Close releases it.
type Alarm struct {
	f    *os.File
	c    chan struct{}
	done chan struct{}

	mu sync.Mutex // serialises Set with Close
}

// NewAlarm returns an unset Alarm.
func NewAlarm() (*Alarm, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_BOOTTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("boottime: timerfd_create: %w", err)
	}
	a := &Alarm{f: os.NewFile(uintptr(fd), "boottime-alarm"), c: make(chan struct{}, 1), done: make(chan struct{})}
	go a.read()
	return a, nil
}

func (a *Alarm) read() {
	defer close(a.done)
	var b [8]byte
	for {
		if _, err := a.f.Read(b[:]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue // EAGAIN after a re-arm raced the poller: wait again
		}
		select {
		case a.c <- struct{}{}:
		default:
		}
	}
}

// C receives when the alarm fires. A receiver should compare Now with the
// instant it cares about: a firing for an earlier Set may still be pending.
func (a *Alarm) C() <-chan struct{} { return a.c }

// Set arms the alarm for at, replacing any earlier setting. An instant in
// the past fires at once.
func (a *Alarm) Set(at Instant) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if at <= 0 {
		at = 1 // a zero value would disarm the timerfd
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(at))}
	rc, err := a.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("boottime: alarm: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.TimerfdSettime(int(fd), unix.TFD_TIMER_ABSTIME, &spec, nil)
	}); err != nil {
		return fmt.Errorf("boottime: alarm: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("boottime: timerfd_settime: %w", serr)
	}
	return nil
}

// Close disarms and releases the alarm and waits for its reader.
func (a *Alarm) Close() error {
	a.mu.Lock()
	err := a.f.Close()
	a.mu.Unlock()
	<-a.done
	return err
}
