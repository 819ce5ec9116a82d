// Package atomicfile replaces a file so that it survives a crash or a power
// loss: readers see the old content or the new, never a part, and once
// Write returns the new content is on disk under the file's name.
package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// TempPrefix begins the name of every temporary file Write makes, beside
// the file it replaces: .tmp-<name>-<random>. A file so named that no
// Write is still making is what a crash left behind before the rename; the
// file it was to replace is intact.
const TempPrefix = ".tmp-"

// Write replaces path with data, durably: a temporary file in the same
// directory (so that the rename cannot cross a file system) given mode
// perm, written, synced, renamed over path, and the directory synced, so
// that the rename itself is on disk too. Without that last sync a power
// loss can bring back the old file, or none, after Write returned. The
// first step that fails ends it, its error returned; the temporary file is
// then removed. Secret files are written 0600.
func Write(path string, data []byte, perm fs.FileMode) error {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPrefix+name+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if !renamed {
			_ = os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file 0600 less the umask; the mode asked for is
	// the mode the file gets, whatever the umask.
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// RemoveLeftovers removes from dir the temporary files of writes a crash
// cut short. Only a caller that knows no Write into dir is under way may
// call it (a daemon at start, before it writes), or it may remove the file
// a Write is about to rename.
func RemoveLeftovers(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), TempPrefix) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
