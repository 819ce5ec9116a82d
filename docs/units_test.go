package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unitKeys reads a systemd unit file's [Service] and [Unit] settings: each
// key's values, in order (comments and continuation-free lines only, as
// deploy/ writes them).
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not a setting: %q", path, line)
		}
		keys[k] = append(keys[k], v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// packageFiles is the set of paths a deploy/packages/*.yaml installs.
func packageFiles(t *testing.T, path string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+dst:\s*(\S+)\s*$`).FindAllStringSubmatch(string(raw), -1) {
		files[m[1]] = true
	}
	return files
}

// TestUnitsAgreeWithDocsAndPackages reads each shipped unit beside the
// code, the docs and the package that installs it: the unit's ExecStart
// binary, its Documentation= page and the unit itself are in the package;
// runnerd's RestartPreventExitStatus= holds the daemon's exit status for a
// refused host token (3) and for bad configuration (2), as
// docs/operations.md says; and every variable the packaged env files name
// is a flag of the command they configure.
func TestUnitsAgreeWithDocsAndPackages(t *testing.T) {
	root := ".."
	ops, err := os.ReadFile("operations.md")
	if err != nil {
		t.Fatal(err)
	}
	main, err := os.ReadFile(filepath.Join(root, "cmd/runnerd/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`const exitHostTokenRefused = (\d+)`).FindSubmatch(main)
	if m == nil {
		t.Fatal("cmd/runnerd/main.go has no exitHostTokenRefused")
	}
	refused := string(m[1])

	for _, u := range []struct {
		name, command string
		flagsIn       []string // files whose flag names the env file's variables must be
		envPrefix     string
	}{
		{"runnerd", "runnerd", []string{"cmd/runnerd/config.go"}, "RUNNERD_"},
		{"controlplane", "controlplane", []string{"cmd/controlplane/serve.go"}, "CONTROLPLANE_"},
	} {
		t.Run(u.name, func(t *testing.T) {
			keys := unitKeys(t, filepath.Join(root, "deploy", u.name+".service"))
			files := packageFiles(t, filepath.Join(root, "deploy/packages", u.name+".yaml"))
			if !files["/lib/systemd/system/"+u.name+".service"] {
				t.Errorf("the package does not install its unit")
			}
			for _, exec := range keys["ExecStart"] {
				bin := strings.Fields(exec)[0]
				if !files[bin] || filepath.Base(bin) != u.command {
					t.Errorf("ExecStart=%s: %s is not the package's %s", exec, bin, u.command)
				}
			}
			for _, doc := range keys["Documentation"] {
				for _, d := range strings.Fields(doc) {
					if p, ok := strings.CutPrefix(d, "file://"); !ok || !files[p] {
						t.Errorf("Documentation=%s: not a file the package installs", d)
					}
				}
			}
			if files["/etc/"+u.name+"/"+u.name+".env"] {
				env, err := os.ReadFile(filepath.Join(root, "deploy", u.name+".env"))
				if err != nil {
					t.Fatal(err)
				}
				var src strings.Builder
				for _, f := range u.flagsIn {
					b, err := os.ReadFile(filepath.Join(root, f))
					if err != nil {
						t.Fatal(err)
					}
					src.Write(b)
				}
				vars := regexp.MustCompile(`(?m)^#?`+u.envPrefix+`([A-Z_]+)=`).FindAllStringSubmatch(string(env), -1)
				if len(vars) == 0 {
					t.Errorf("deploy/%s.env names no variable", u.name)
				}
				for _, v := range vars {
					flag := strings.ToLower(strings.ReplaceAll(v[1], "_", "-"))
					if !strings.Contains(src.String(), `"`+flag+`"`) {
						t.Errorf("deploy/%s.env names %s%s, but %s has no --%s", u.name, u.envPrefix, v[1], u.command, flag)
					}
				}
			}
		})
	}

	keys := unitKeys(t, filepath.Join(root, "deploy/runnerd.service"))
	prevent := keys["RestartPreventExitStatus"]
	if len(prevent) != 1 {
		t.Fatalf("runnerd.service has RestartPreventExitStatus %q, want one line", prevent)
	}
	statuses := strings.Fields(prevent[0])
	for _, want := range []string{"2", refused} {
		found := false
		for _, s := range statuses {
			found = found || s == want
		}
		if !found {
			t.Errorf("RestartPreventExitStatus=%s lacks %s", prevent[0], want)
		}
	}
	if !strings.Contains(string(ops), "`RestartPreventExitStatus="+prevent[0]+"`") {
		t.Errorf("docs/operations.md does not say the unit's RestartPreventExitStatus=%s", prevent[0])
	}
	if !strings.Contains(string(ops), "exits "+refused) {
		t.Errorf("docs/operations.md does not say the daemon exits %s on a refused host token", refused)
	}
}
