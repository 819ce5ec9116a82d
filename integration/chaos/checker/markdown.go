package checker

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Run describes a campaign for its report: what ran and how to run it again.
type Run struct {
	Seed     int64
	Turns    int           // turns the campaign asked for
	Hosts    int           // runnerd hosts
	Replicas int           // control-plane replicas
	Duration time.Duration // wall time of the run
	Date     time.Time
	// Machine says where it ran ("2 cores, load average 1.9"): figures
	// mean little without it.
	Machine string
	// Build names the broken build the run used ("chaos_broken_fence"),
	// "" for the product as released.
	Build string
	// Command reproduces the run ("make chaos SEED=… TURNS=…").
	Command string
}

// Markdown renders the report of run as a section of docs/reliability.md:
// the run, the table of counts, the fault mix, and every violation with
// its evidence (the first few of each property).
func (r Report) Markdown(run Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Seed **%d**, %d turns asked for", run.Seed, run.Turns)
	if run.Hosts > 0 {
		fmt.Fprintf(&b, ", %d hosts, %d control-plane replicas", run.Hosts, run.Replicas)
	}
	if run.Duration > 0 {
		fmt.Fprintf(&b, ", %s", run.Duration.Round(time.Second))
	}
	if !run.Date.IsZero() {
		fmt.Fprintf(&b, ", run %s", run.Date.UTC().Format("2006-01-02 15:04 UTC"))
	}
	if run.Machine != "" {
		fmt.Fprintf(&b, " on %s", run.Machine)
	}
	b.WriteString(".")
	if run.Build != "" {
		fmt.Fprintf(&b, " Broken build: `%s`.", run.Build)
	}
	if run.Command != "" {
		fmt.Fprintf(&b, " Reproduce: `%s`.", run.Command)
	}
	b.WriteString("\n\n")

	t := r.Totals
	fmt.Fprintf(&b, "%d records, %d requests, %d turns (%s), %d prompts received, conversations at the end: %s.\n\n",
		t.Records, t.Requests, t.Turns, counts(t.JobStates), t.Prompts, counts(t.Conversations))
	if t.UnmatchedPrompts > 0 || t.UnattributedAgents > 0 {
		fmt.Fprintf(&b, "Not checked: %d prompts received that match no job's, %d agents with no attempt.\n\n",
			t.UnmatchedPrompts, t.UnattributedAgents)
	}

	b.WriteString("| Count | Value |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| agents that ran (lines: processes; ACP: turns) | %d |\n", t.AgentsRan)
	fmt.Fprintf(&b, "| of them judged for overlap | %d |\n", t.AgentsJudged)
	for _, p := range properties {
		fmt.Fprintf(&b, "| %s | %d |\n", p.title, r.Count(p.p))
	}
	fmt.Fprintf(&b, "\nReplica kills and restarts: %d; (loss, host) pairs judged: %d, costs set aside for another fault on the host then: %d; %s. Idle sandboxes stopped: %d, woken: %d.\n",
		t.ReplicaLosses, t.ReplicaJudged, t.ReplicaExcused, gapsLine(t.FailoverGaps), t.SandboxesEvicted, t.SandboxesWoken)
	b.WriteString("\nFault mix: ")
	if len(t.Faults) == 0 {
		b.WriteString("none")
	} else {
		b.WriteString(counts(t.Faults))
	}
	b.WriteString(".\n")

	if v := r.Violations(); len(v) > 0 {
		const shown = 5
		b.WriteString("\nViolations (history lines in parentheses):\n\n")
		per := map[Property]int{}
		for _, f := range v {
			per[f.Property]++
			if per[f.Property] > shown {
				continue
			}
			fmt.Fprintf(&b, "- `%s` %s: %s (%s)\n", f.Property, f.Subject, f.Detail, joinInts(f.Lines))
		}
		for _, p := range properties {
			if n := per[p.p]; n > shown {
				fmt.Fprintf(&b, "- … and %d more `%s`\n", n-shown, p.p)
			}
		}
	}
	return b.String()
}

// counts renders a map of counts as "a 3, b 1", largest first.
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(a, b int) bool {
		if m[keys[a]] != m[keys[b]] {
			return m[keys[a]] > m[keys[b]]
		}
		return keys[a] < keys[b]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = fmt.Sprint(n)
	}
	return "lines " + strings.Join(parts, ", ")
}

// LongRun names the section of docs/reliability.md that the last long
// campaign (make chaos) writes.
const LongRun = "long"

// Markers delimit a run's section in a document: what lies between
// SectionBegin(name) and SectionEnd(name) belongs to that run and is
// replaced whole by the next one.
func SectionBegin(name string) string { return "<!-- chaos:" + name + ":begin -->" }

// SectionEnd closes the section SectionBegin(name) opened.
func SectionEnd(name string) string { return "<!-- chaos:" + name + ":end -->" }

// ReplaceSection returns doc with the text between the markers of name
// replaced by body. Both markers must be there, once each, in order.
func ReplaceSection(doc []byte, name, body string) ([]byte, error) {
	begin, end := []byte(SectionBegin(name)), []byte(SectionEnd(name))
	i, j := bytes.Index(doc, begin), bytes.Index(doc, end)
	if i < 0 || j < i || bytes.Count(doc, begin) != 1 || bytes.Count(doc, end) != 1 {
		return nil, fmt.Errorf("the section %q needs its markers %s and %s, once each, in order", name, begin, end)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)])
	out.WriteString("\n")
	out.WriteString(strings.TrimSpace(body))
	out.WriteString("\n")
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// UpdateSection replaces the section name of the document at path with body.
func UpdateSection(path, name, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	out, err := ReplaceSection(doc, name, body)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// gapsLine renders the failover renewal gaps: how many, p50 and max.
func gapsLine(gaps []time.Duration) string {
	if len(gaps) == 0 {
		return "no renewal gap measured across a replica's loss"
	}
	return fmt.Sprintf("renewal gap across a replica's loss (last renewal through it to the next through the other): %d measured, p50 %v, max %v",
		len(gaps), gaps[len(gaps)/2].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond))
}
