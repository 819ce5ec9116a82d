package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/runnerd/runnerd/wire"
)

func TestParseFreeMin(t *testing.T) {
	for _, c := range []struct {
		in   string
		want FreeMin
		ok   bool
	}{
		{"10%", FreeMin{Percent: 10}, true},
		{" 2.5 %", FreeMin{Percent: 2.5}, true},
		{"0", FreeMinOff, true},
		{"0%", FreeMinOff, true},
		{"1073741824", FreeMin{Bytes: 1 << 30}, true},
		{"512MiB", FreeMin{Bytes: 512 << 20}, true},
		{"2GiB", FreeMin{Bytes: 2 << 30}, true},
		{"100%", FreeMin{}, false},
		{"-1", FreeMin{}, false},
		{"ten", FreeMin{}, false},
		{"5GB", FreeMin{}, false},
	} {
		got, err := ParseFreeMin(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseFreeMin(%q) = %+v, %v; want %+v, ok %v", c.in, got, err, c.want, c.ok)
		}
		if c.ok {
			if back, err := ParseFreeMin(got.String()); err != nil || back != got {
				t.Errorf("ParseFreeMin(%q.String() = %q) = %+v, %v", c.in, got.String(), back, err)
			}
		}
	}
}

// S2's measurement: MemAvailable of a meminfo file against a floor, and
// the free space of a real tmpfs against another; a file that cannot be
// read is no evidence of pressure but a failure the caller records.
func TestS2PressureMeasurement(t *testing.T) {
	dir := t.TempDir()
	meminfo := filepath.Join(dir, "meminfo")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(meminfo, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("MemTotal:        1048576 kB\nMemFree:          10000 kB\nMemAvailable:     102400 kB\n")
	p := &hostPressure{meminfo: meminfo, minDisk: FreeMinOff, minMem: FreeMin{Percent: 20}}
	short, failed := p.short()
	if failed != nil || short == nil || short.Resource != wire.PressureMemory || short.FreeBytes != 100<<20 ||
		short.TotalBytes != 1<<30 || short.MinFreeBytes != (1<<30)/5 {
		t.Fatalf("100 MiB available of 1 GiB, floor 20 %%: %+v, %v", short, failed)
	}
	p.minMem = FreeMin{Bytes: 64 << 20}
	if short, failed := p.short(); short != nil || failed != nil {
		t.Fatalf("100 MiB available, floor 64 MiB: %+v, %v; want no pressure", short, failed)
	}
	write("MemTotal:        1048576 kB\n")
	if short, failed := p.short(); short != nil || failed[meminfo] == nil {
		t.Fatalf("meminfo without MemAvailable: %+v, %v; want no pressure and a failure", short, failed)
	}

	if os.Geteuid() != 0 {
		t.Skip("the disk half mounts a tmpfs: needs root")
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	p = &hostPressure{disks: []string{mnt}, minDisk: FreeMin{Percent: 50}, minMem: FreeMinOff}
	if short, failed := p.short(); short != nil || failed != nil {
		t.Fatalf("an empty 8 MiB tmpfs, floor 50 %%: %+v, %v; want no pressure", short, failed)
	}
	if err := os.WriteFile(filepath.Join(mnt, "filler"), make([]byte, 5<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	short, failed = p.short()
	if failed != nil || short == nil || short.Resource != wire.PressureDisk || short.TotalBytes != 8<<20 ||
		short.FreeBytes > 3<<20 || short.MinFreeBytes != 4<<20 {
		t.Fatalf("5 MiB written to 8 MiB, floor 50 %%: %+v, %v", short, failed)
	}
}
