package runner

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/wire"
)

// Defaults of host pressure (S2).
var (
	DefaultMinFreeDisk = FreeMin{Percent: 10}
	// DefaultMemInfo is where MemAvailable is read.
	DefaultMemInfo = "/proc/meminfo"
)

// FreeMin is a floor of free disk or memory: a share of the total
// (Percent, 0 to 100) or a byte count (Bytes). The zero value is
// Config's default; a negative Bytes is off.
type FreeMin struct {
	Percent float64
	Bytes   int64
}

// FreeMinOff is a FreeMin that never finds pressure.
var FreeMinOff = FreeMin{Bytes: -1}

func (m FreeMin) off() bool  { return m.Bytes < 0 || (m.Bytes == 0 && m.Percent <= 0) }
func (m FreeMin) zero() bool { return m == FreeMin{} }

// floor is the bytes that must stay free of total.
func (m FreeMin) floor(total int64) int64 {
	if m.Bytes > 0 {
		return m.Bytes
	}
	return int64(float64(total) * m.Percent / 100)
}

// String writes m as ParseFreeMin reads it.
func (m FreeMin) String() string {
	switch {
	case m.off():
		return "0"
	case m.Bytes > 0:
		return strconv.FormatInt(m.Bytes, 10)
	}
	return strconv.FormatFloat(m.Percent, 'f', -1, 64) + "%"
}

// ParseFreeMin reads a floor of free space: "10%" (of the total), a byte
// count with an optional binary suffix ("512MiB", "2GiB", "1073741824"),
// or "0": off.
func ParseFreeMin(s string) (FreeMin, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v >= 100 {
			return FreeMin{}, fmt.Errorf("%q: want a percentage from 0 to below 100, or bytes", s)
		}
		if v == 0 {
			return FreeMinOff, nil
		}
		return FreeMin{Percent: v}, nil
	}
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return FreeMin{}, fmt.Errorf("%q: want a percentage (10%%) or bytes (512MiB)", s)
	}
	if v == 0 {
		return FreeMinOff, nil
	}
	return FreeMin{Bytes: v * mult}, nil
}

// freeSpace is one measurement: free and total bytes.
type freeSpace struct{ free, total int64 }

// diskFree measures the filesystem holding path as an unprivileged
// writer sees it (statfs: blocks available, not free).
func diskFree(path string) (freeSpace, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return freeSpace{}, err
	}
	bs := int64(st.Bsize)
	return freeSpace{free: int64(st.Bavail) * bs, total: int64(st.Blocks) * bs}, nil
}

// memFree reads MemAvailable and MemTotal from a meminfo file: the
// kernel's estimate of memory available to new work without swapping.
func memFree(path string) (freeSpace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return freeSpace{}, err
	}
	var fs freeSpace
	var got int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "MemAvailable" && name != "MemTotal") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return freeSpace{}, fmt.Errorf("meminfo %s: unreadable %q", name, rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return freeSpace{}, fmt.Errorf("meminfo %s: unreadable %q", name, rest)
		}
		if name == "MemAvailable" {
			fs.free = kb << 10
		} else {
			fs.total = kb << 10
		}
		got++
	}
	if got != 2 {
		return freeSpace{}, errors.New("meminfo: no MemAvailable and MemTotal")
	}
	return fs, nil
}

// pressurePhase is whether the host withholds first turns.
type pressurePhase int

const (
	pressureNone        pressurePhase = iota // enough free: every turn is claimed
	pressureWithholding                      // short even with the idle sandboxes stopped: first turns withheld
)

// hostPressure is the daemon's view of S2: the floors, the paths it
// measures, and what it last found.
type hostPressure struct {
	disks   []string // filesystems that must keep MinFreeDisk free (the state directory's, Docker's root)
	meminfo string
	minDisk FreeMin
	minMem  FreeMin

	mu         sync.Mutex // guards phase, report and unmeasured
	phase      pressurePhase
	report     wire.SandboxPressure // while withholding
	unmeasured map[string]bool      // paths whose failure was recorded, until they measure again
}

func (p *hostPressure) on() bool { return !p.minDisk.off() || !p.minMem.off() }

// short measures and returns what is short (Since unset), or nil. A path
// it cannot measure is no evidence of pressure: it is skipped, recorded
// once by the caller (failed).
func (p *hostPressure) short() (short *wire.SandboxPressure, failed map[string]error) {
	check := func(resource, path string, min FreeMin, measure func(string) (freeSpace, error)) bool {
		fs, err := measure(path)
		if err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[path] = err
			return false
		}
		if floor := min.floor(fs.total); fs.free < floor {
			short = &wire.SandboxPressure{Resource: resource, FreeBytes: fs.free, TotalBytes: fs.total, MinFreeBytes: floor}
			return true
		}
		return false
	}
	if !p.minDisk.off() {
		for _, d := range p.disks {
			if check(wire.PressureDisk, d, p.minDisk, diskFree) {
				return short, failed
			}
		}
	}
	if !p.minMem.off() {
		check(wire.PressureMemory, p.meminfo, p.minMem, memFree)
	}
	return short, failed
}

// heartbeat is the host heartbeat's sandbox_pressure: nil unless
// withholding.
func (p *hostPressure) heartbeat() *wire.SandboxPressure {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase != pressureWithholding {
		return nil
	}
	r := p.report
	return &r
}

// withholdFirstTurns is asked before each claim (S2). Below a floor it
// stops idle sandboxes, the longest idle first, measuring again after
// each, until nothing is short; if something still is, it reports true:
// the claim asks only for this host's own conversations' turns
// (wire.ClaimRequest.PinnedOnly) — no conversation's first turn — and
// host heartbeats say sandbox_pressure. Turns of conversations already
// here still run, and nothing a turn holds is stopped (evict asks under
// the sandbox's lock, as idle eviction does). Stopping frees a sandbox's
// memory, not its disk (S1 keeps it): under disk pressure every idle
// sandbox is stopped and first turns are withheld until the operator
// frees space or conversations are deleted.
func (d *Daemon) withholdFirstTurns(ctx context.Context) bool {
	p := d.pressure
	if !p.on() {
		return false
	}
	short := d.measurePressure()
	if short != nil {
		if st, ok := d.cfg.Backend.(sandboxStopper); ok && d.idle != nil {
			// The claim loop's own time: each listing and stop is bounded,
			// and tells the watchdog so (a host stopping many sandboxes
			// is not stuck).
			d.health.expect(loopClaim, d.cfg.ControlTimeout+healthSlack)
			for _, c := range d.idleOldestFirst(ctx, st) {
				if ctx.Err() != nil {
					return true
				}
				d.health.expect(loopClaim, d.cfg.ControlTimeout+d.cfg.StopGrace+healthSlack)
				d.evict(ctx, st, c, 0, evictPressure)
				if short = d.measurePressure(); short == nil {
					break
				}
			}
		}
	}
	p.mu.Lock()
	was := p.phase
	if short != nil {
		if was != pressureWithholding {
			short.Since = time.Now().UTC()
		} else {
			short.Since = p.report.Since
		}
		p.phase, p.report = pressureWithholding, *short
	} else {
		p.phase = pressureNone
	}
	p.mu.Unlock()
	switch {
	case short != nil && was != pressureWithholding:
		d.log.LogAttrs(context.Background(), slog.LevelWarn, diagnostics.MsgSandboxPressure, pressureAttrs(*short)...)
	case short == nil && was == pressureWithholding:
		d.log.LogAttrs(context.Background(), slog.LevelInfo, diagnostics.MsgSandboxPressureCleared)
	default:
		return short != nil
	}
	select { // Admin → Servers says it now, not at the next beat
	case d.kickBeat <- struct{}{}:
	default:
	}
	return short != nil
}

// measurePressure measures, recording each path it cannot measure once.
func (d *Daemon) measurePressure() *wire.SandboxPressure {
	p := d.pressure
	short, failed := p.short()
	p.mu.Lock()
	var first []string
	for path := range failed {
		if !p.unmeasured[path] {
			p.unmeasured[path] = true
			first = append(first, path)
		}
	}
	for path := range p.unmeasured {
		if failed[path] == nil {
			delete(p.unmeasured, path)
		}
	}
	p.mu.Unlock()
	for _, path := range first {
		d.log.LogAttrs(context.Background(), slog.LevelWarn, diagnostics.MsgSandboxPressureUnmeasured,
			slog.String(diagnostics.KeyPath, path), slog.String(diagnostics.KeyClass, diagnostics.Class(failed[path])))
	}
	return short
}

func pressureAttrs(s wire.SandboxPressure) []slog.Attr {
	return []slog.Attr{slog.String(diagnostics.KeyResource, s.Resource), slog.Int64(diagnostics.KeyFreeBytes, s.FreeBytes),
		slog.Int64(diagnostics.KeyTotalBytes, s.TotalBytes), slog.Int64(diagnostics.KeyMinFreeBytes, s.MinFreeBytes)}
}

// idleOldestFirst lists the sandboxes (starting the clocks of new ones,
// as an idle round does) and returns those no turn holds and not known
// stopped or kept, the longest idle first.
func (d *Daemon) idleOldestFirst(ctx context.Context, st sandboxStopper) []string {
	d.noteSandboxes(ctx, st)
	type cand struct {
		conv  string
		since time.Time
	}
	var cs []cand
	d.mu.Lock()
	for c, s := range d.idle {
		if d.turnConvs[c] == 0 && s.phase == sandboxRetained {
			cs = append(cs, cand{c, s.since})
		}
	}
	d.mu.Unlock()
	slices.SortFunc(cs, func(a, b cand) int {
		return cmp.Or(a.since.Compare(b.since), strings.Compare(a.conv, b.conv))
	})
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.conv
	}
	return out
}
