package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// row is one figure. NotRun, when set, says why there is no figure.
type row struct {
	ID     string    `json:"id"`
	Store  storeKind `json:"store,omitempty"`
	What   string    `json:"what"`
	Value  float64   `json:"value"` // 0 is a figure too (a share of none); NotRun says when there is none
	Unit   string    `json:"unit,omitempty"`
	Detail string    `json:"detail,omitempty"`
	NotRun string    `json:"not_run,omitempty"`
}

// machine is where the figures were taken.
type machine struct {
	Cores     int    `json:"cores"`
	CPU       string `json:"cpu"`
	MemoryGiB string `json:"memory_gib"`
	OS        string `json:"os"`
}

// settings are what the figures depend on besides the machine.
type settings struct {
	Quick             bool   `json:"quick"`
	SQLiteSynchronous string `json:"sqlite_synchronous"`
	Postgres          bool   `json:"postgres"`
	Workers           int    `json:"workers"`
	Hosts             int    `json:"hosts"`
	Slots             int    `json:"slots"`
	StormLeases       int    `json:"storm_leases"`
}

// report is one run's figures, added by one goroutine.
type report struct {
	Date       string   `json:"date"`
	Machine    machine  `json:"machine"`
	Go         string   `json:"go"`
	Settings   settings `json:"settings"`
	LoadBefore string   `json:"load_before"`
	LoadAfter  string   `json:"load_after"`
	Seconds    float64  `json:"seconds"`
	Rows       []row    `json:"rows"`
	// progress, when set, sees each row as it is added.
	progress func(row)
}

func newReport(o options) *report {
	return &report{
		Date:    time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Machine: machine{Cores: runtime.NumCPU(), CPU: cpuModel(), MemoryGiB: memory(), OS: runtime.GOOS + "/" + runtime.GOARCH},
		Go:      runtime.Version(),
		Settings: settings{Quick: o.quick, SQLiteSynchronous: "FULL", Postgres: o.postgres != "",
			Workers: o.workers, Hosts: o.hosts, Slots: o.slots, StormLeases: o.storm},
		LoadBefore: loadAverage(),
	}
}

func (r *report) add(x row) {
	r.Rows = append(r.Rows, x)
	if r.progress != nil {
		r.progress(x)
	}
}

func (r *report) finish(took time.Duration) {
	r.LoadAfter = loadAverage()
	r.Seconds = took.Round(time.Second).Seconds()
}

// Markers of the generated section of docs/performance.md.
const (
	beginMarker = "<!-- bench:begin — written by `make bench` (cmd/bench); edits here are replaced -->"
	endMarker   = "<!-- bench:end -->"
)

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s, %.0f s: %d cores (%s), %s GiB, %s, %s; load average %s before, %s after.\n",
		r.Date, r.Seconds, r.Machine.Cores, r.Machine.CPU, r.Machine.MemoryGiB, r.Machine.OS, r.Go, r.LoadBefore, r.LoadAfter)
	pg := "not run (no DSN)"
	if r.Settings.Postgres {
		pg = "local, default settings"
	}
	fmt.Fprintf(&b, "Settings: SQLite synchronous=%s; PostgreSQL %s; %d workers (B1); %d hosts × %d slots (B2); storm of %d leases (B6)",
		r.Settings.SQLiteSynchronous, pg, r.Settings.Workers, r.Settings.Hosts, r.Settings.Slots, r.Settings.StormLeases)
	if r.Settings.Quick {
		b.WriteString("; **-quick** (token sizes: not figures to compare)")
	}
	b.WriteString(".\n\n| | What | Store | Figure | Detail |\n| --- | --- | --- | --- | --- |\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", x.ID, x.What, x.store(), x.figure(), x.Detail)
	}
	return b.String()
}

func (x row) figure() string {
	if x.NotRun != "" {
		return "not run: " + x.NotRun
	}
	return fmt.Sprintf("**%s** %s", number(x.Value), x.Unit)
}

func (x row) store() string {
	if x.Store == "" {
		return "—"
	}
	return string(x.Store)
}

// line is the row on one line, for the progress log.
func (x row) line() string {
	return fmt.Sprintf("%s %s %s: %s (%s)", x.ID, x.store(), x.What, strings.ReplaceAll(x.figure(), "**", ""), x.Detail)
}

// number prints a figure with the precision its size deserves.
func number(v float64) string {
	switch {
	case v >= 1000:
		s := strconv.FormatFloat(v, 'f', 0, 64)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		return s
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// splice replaces the generated section of the markdown file at path (or
// appends one when it has none).
func (r *report) splice(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	section := beginMarker + "\n" + r.markdown() + endMarker
	doc := string(old)
	i, j := strings.Index(doc, beginMarker), strings.Index(doc, endMarker)
	switch {
	case i >= 0 && j > i:
		doc = doc[:i] + section + doc[j+len(endMarker):]
	case i < 0 && j < 0:
		doc = strings.TrimRight(doc, "\n") + "\n\n" + section + "\n"
	default:
		return fmt.Errorf("%s: the markers of the generated section are out of order", path)
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memory() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return strconv.FormatFloat(kb/(1<<20), 'f', 1, 64)
		}
	}
	return "?"
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
