package docs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// step is one numbered step of protocol.md's walkthrough: the commands of
// its sh block and the answer the document shows for them.
type step struct {
	title  string
	script string
	lang   string // json or text: how the answer is compared
	answer string
}

// walkthrough reads the section "Drive one turn by hand with curl" of
// protocol.md into its steps.
func walkthrough(t *testing.T) []step {
	t.Helper()
	raw, err := os.ReadFile("protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Drive one turn by hand with curl\n")
	if !ok {
		t.Fatal(`protocol.md has no section "Drive one turn by hand with curl"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var steps []step
	var title string
	sc := bufio.NewScanner(strings.NewReader(section))
	for sc.Scan() {
		line := sc.Text()
		if m := regexp.MustCompile(`^\*\*(\d+)\. ([^*]+)\*\*`).FindStringSubmatch(line); m != nil {
			title = m[1] + ". " + m[2]
			continue
		}
		lang, isFence := strings.CutPrefix(line, "```")
		if !isFence || lang == "" {
			continue
		}
		var body strings.Builder
		for sc.Scan() && sc.Text() != "```" {
			body.WriteString(sc.Text() + "\n")
		}
		switch lang {
		case "sh":
			steps = append(steps, step{title: title, script: body.String()})
		case "json", "text":
			if len(steps) == 0 || steps[len(steps)-1].lang != "" {
				t.Fatalf("step %q: a %s answer with no command before it", title, lang)
			}
			steps[len(steps)-1].lang, steps[len(steps)-1].answer = lang, body.String()
		default:
			t.Fatalf("step %q: a %s block; the walkthrough has sh, json and text", title, lang)
		}
	}
	return steps
}

// TestProtocolWalkthroughIsWhatTheServerSays runs protocol.md's "Drive one
// turn by hand with curl" as written — its commands in one bash, from a
// directory with bin/controlplane and the server's data/, against a real
// `controlplane serve` — and compares each answer with the one the
// document shows: JSON by every key at every depth and the kind of every
// value (ids, tokens and times differ by design), text line by line. A
// field the server added or dropped fails here, not in a reader's hands.
func TestProtocolWalkthroughIsWhatTheServerSays(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed; .ci/run installs it", tool)
			}
			t.Skipf("%s is not installed: the walkthrough needs bash, curl and jq", tool)
		}
	}
	steps := walkthrough(t)
	if len(steps) < 10 || !strings.Contains(steps[0].script, "controlplane serve") {
		t.Fatalf("the walkthrough has %d steps; want its first to start the control plane", len(steps))
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "controlplane")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/controlplane").CombinedOutput(); err != nil {
		t.Fatalf("build the control plane: %v\n%s", err, out)
	}
	cp := startServe(t, dir, bin)

	// Step 1 is the server itself; the rest runs in one shell, so that the
	// variables of one step are there in the next. A marker line ends each
	// step's output.
	var script strings.Builder
	script.WriteString("set -e\ncd " + dir + "\n")
	for i, s := range steps[1:] {
		cmds := strings.ReplaceAll(s.script, "CP=http://127.0.0.1:8080", "CP="+cp)
		fmt.Fprintf(&script, "%s\necho '@@end %d@@'\n", cmds, i+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bounds a failure only
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the walkthrough's commands: %v\n%s", err, out)
	}
	outputs := strings.Split(string(out), "\n")
	var got []string
	var cur strings.Builder
	for _, line := range outputs {
		if regexp.MustCompile(`^@@end \d+@@$`).MatchString(line) {
			got = append(got, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(line + "\n")
	}
	if len(got) != len(steps)-1 {
		t.Fatalf("%d step outputs for %d steps:\n%s", len(got), len(steps)-1, out)
	}
	for i, s := range steps[1:] {
		out := got[i]
		switch s.lang {
		case "":
			if strings.TrimSpace(out) != "" {
				t.Errorf("step %s prints %q; the document shows no answer", s.title, out)
			}
		case "text":
			if strings.TrimSpace(out) != strings.TrimSpace(s.answer) {
				t.Errorf("step %s:\nthe server says\n%s\nthe document shows\n%s", s.title, out, s.answer)
			}
		case "json":
			want, err := jsonValues(s.answer)
			if err != nil {
				t.Errorf("step %s: the document's answer is not JSON: %v\n%s", s.title, err, s.answer)
				continue
			}
			have, err := jsonValues(out)
			if err != nil {
				t.Errorf("step %s: the server's answer is not JSON: %v\n%s", s.title, err, out)
				continue
			}
			if diffs := shapeDiff("", want, have); len(diffs) > 0 {
				t.Errorf("step %s: the document's answer differs from the server's:\n  %s\nthe server says\n%s", s.title, strings.Join(diffs, "\n  "), out)
			}
		}
	}
}

// startServe runs bin's serve in dir (its data in dir/data, as step 1's
// command leaves it) and returns its URL once it serves.
func startServe(t *testing.T, dir, bin string) string {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0")
	cmd.Dir = dir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	url := ""
	var seen strings.Builder
	for url == "" || !strings.Contains(seen.String(), "admin page") {
		if !sc.Scan() {
			t.Fatalf("serve stopped before it served:\n%s", seen.String())
		}
		seen.WriteString(sc.Text() + "\n")
		if m := regexp.MustCompile(`serving (http://\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return url
}

// jsonValues decodes every JSON value of s, in order (one answer may be
// several lines, each a value).
func jsonValues(s string) ([]any, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	var vs []any
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		vs = append(vs, v)
	}
	if len(vs) == 0 {
		return nil, fmt.Errorf("no JSON value")
	}
	return vs, nil
}

// shapeDiff lists where have differs from want in keys, in the kinds of
// values, or in the lengths of arrays; strings and numbers may differ.
func shapeDiff(path string, want, have any) []string {
	kind := func(v any) string {
		switch v.(type) {
		case map[string]any:
			return "object"
		case []any:
			return "array"
		case string:
			return "string"
		case float64:
			return "number"
		case bool:
			return "boolean"
		case nil:
			return "null"
		}
		return fmt.Sprintf("%T", v)
	}
	if kind(want) != kind(have) {
		return []string{fmt.Sprintf("%s: the document shows a %s, the server says a %s", pathOr(path), kind(want), kind(have))}
	}
	var diffs []string
	switch w := want.(type) {
	case map[string]any:
		h := have.(map[string]any)
		keys := map[string]bool{}
		for k := range w {
			keys[k] = true
		}
		for k := range h {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			wv, inW := w[k]
			hv, inH := h[k]
			switch {
			case !inW:
				diffs = append(diffs, fmt.Sprintf("%s.%s: the server says it, the document does not show it", path, k))
			case !inH:
				diffs = append(diffs, fmt.Sprintf("%s.%s: the document shows it, the server does not say it", path, k))
			default:
				diffs = append(diffs, shapeDiff(path+"."+k, wv, hv)...)
			}
		}
	case []any:
		h := have.([]any)
		if len(w) != len(h) {
			return []string{fmt.Sprintf("%s: the document shows %d items, the server says %d", pathOr(path), len(w), len(h))}
		}
		for i := range w {
			diffs = append(diffs, shapeDiff(fmt.Sprintf("%s[%d]", path, i), w[i], h[i])...)
		}
	}
	return diffs
}

func pathOr(p string) string {
	if p == "" {
		return "the answer"
	}
	return p
}
