package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
)

// ScratchImage describes an image built FROM scratch over local files,
// for hosts with no registry: the demo's agent image and the tests'.
type ScratchImage struct {
	// Tag names the image, e.g. "runnerd-demo/agent:dev".
	Tag string
	// Files are put into the image, each at its absolute Path, with mode
	// 0755 when Exec, else 0644. Source is a host file; Data, if Source is
	// empty, is the content.
	Files []ImageFile
	// User is the image's USER ("" for root).
	User string
	// Labels are set on the image.
	Labels map[string]string
}

// ImageFile is one file of a ScratchImage.
type ImageFile struct {
	Path   string
	Source string
	Data   []byte
	Exec   bool
}

// BuildScratchImage builds img through the engine's build API with the
// classic builder (nothing is pulled; engines from 20.10 on). cmd calls it
// for the demo image; the tests call it for theirs.
func BuildScratchImage(ctx context.Context, engine *client.Client, img ScratchImage) error {
	var df strings.Builder
	df.WriteString("FROM scratch\n")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, f := range img.Files {
		if !path.IsAbs(f.Path) || strings.ContainsAny(f.Path, " \n\"") {
			return fmt.Errorf("build image %s: bad path %q", img.Tag, f.Path)
		}
		data := f.Data
		if f.Source != "" {
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return fmt.Errorf("build image %s: %w", img.Tag, err)
			}
			data = b
		}
		mode := int64(0o644)
		if f.Exec {
			mode = 0o755
		}
		name := "f" + strconv.Itoa(i)
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
		fmt.Fprintf(&df, "COPY %s %s\n", name, f.Path)
	}
	if img.User != "" {
		if strings.ContainsAny(img.User, " \n") {
			return fmt.Errorf("build image %s: bad user %q", img.Tag, img.User)
		}
		fmt.Fprintf(&df, "USER %s\n", img.User)
	}
	dockerfile := []byte(df.String())
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(dockerfile); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	resp, err := engine.ImageBuild(ctx, &buf, build.ImageBuildOptions{
		Tags:        []string{img.Tag},
		Remove:      true,
		ForceRemove: true,
		Labels:      img.Labels,
		Version:     build.BuilderV1,
	})
	if err != nil {
		return fmt.Errorf("build image %s: %w", img.Tag, err)
	}
	defer resp.Body.Close()
	if err := buildOutput(resp.Body); err != nil {
		return fmt.Errorf("build image %s: %w", img.Tag, err)
	}
	return nil
}

// buildOutput reads the build's JSON message stream to its end and returns
// the error it reports, with the build's own log.
func buildOutput(r io.Reader) error {
	dec := json.NewDecoder(r)
	var log strings.Builder
	for {
		var msg struct {
			Stream string `json:"stream"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if log.Len() < 64<<10 {
			log.WriteString(msg.Stream)
		}
		if msg.Error != "" {
			return fmt.Errorf("%s\n%s", msg.Error, log.String())
		}
	}
}
