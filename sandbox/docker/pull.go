package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/docker/cli/cli/config"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/registry"

	"github.com/runnerd/runnerd/sandbox"
)

// dockerHubAuthKey is the key under which the engine's own client keeps
// Docker Hub's credentials in config.json.
const dockerHubAuthKey = "https://index.docker.io/v1/"

// image makes the conversation's image present for a container to be
// created from it, as the pull policy says: never pulls nothing, missing
// pulls only an image that is not here, always pulls every time. It
// returns the pull it made (nil: none). An image that is not here and may
// not or could not be pulled is sandbox.ErrImageUnavailable (S4); an
// engine that does not answer is another error (the host's).
func (b *Backend) image(ctx context.Context, ref string) (*sandbox.ImagePull, error) {
	if b.cfg.Pull != PullAlways {
		_, err := b.cfg.Engine.ImageInspect(ctx, ref)
		switch {
		case err == nil:
			return nil, nil
		case !cerrdefs.IsNotFound(err):
			return nil, fmt.Errorf("inspect image: %w", err)
		case b.cfg.Pull == PullNever:
			return nil, fmt.Errorf("image %q is not on this host and --pull is never: %w", ref, sandbox.ErrImageUnavailable)
		}
	}
	start := time.Now()
	err := b.pull(ctx, ref)
	took := time.Since(start)
	if err != nil {
		recordPull(b.cfg.Logger, RecordImagePullFailed, ref, took)
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, fmt.Errorf("pull image %q: %v: %w", ref, err, sandbox.ErrImageUnavailable)
	}
	recordPull(b.cfg.Logger, RecordImagePulled, ref, took)
	return &sandbox.ImagePull{Image: ref, Duration: took}, nil
}

// pull pulls ref with the credentials the engine's own client would use
// for its registry, and reads the pull's progress stream to its end: the
// engine reports a failed pull there, not in the answer's status.
func (b *Backend) pull(ctx context.Context, ref string) error {
	auth, err := registryAuth(ref)
	if err != nil {
		return err
	}
	rc, err := b.cfg.Engine.ImagePull(ctx, ref, image.PullOptions{RegistryAuth: auth})
	if err != nil {
		return err
	}
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("read the pull's progress: %w", err)
		}
		if msg.Error != "" {
			return errors.New(msg.Error)
		}
		if msg.ErrorDetail.Message != "" {
			return errors.New(msg.ErrorDetail.Message)
		}
	}
}

// registryAuth is the engine API's encoding of the credentials config.json
// holds for ref's registry ("" when it holds none). The directory is
// DOCKER_CONFIG, else ~/.docker, looked up at every pull (the docker CLI's
// own rule; its library reads the file, credsStore and credHelpers
// included). A config.json that cannot be read fails the pull: pulling
// anonymously instead would hide the operator's mistake.
func registryAuth(ref string) (string, error) {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "", fmt.Errorf("image reference: %w", err)
	}
	key := reference.Domain(named)
	if key == "docker.io" {
		key = dockerHubAuthKey
	}
	dir := os.Getenv(config.EnvOverrideConfigDir)
	if dir == "" {
		dir = config.Dir()
	}
	cf, err := config.Load(dir)
	if err != nil {
		return "", err
	}
	ac, err := cf.GetAuthConfig(key)
	if err != nil {
		return "", fmt.Errorf("registry credentials for %s: %w", key, err)
	}
	if ac.Username == "" && ac.Password == "" && ac.IdentityToken == "" && ac.RegistryToken == "" {
		return "", nil
	}
	return registry.EncodeAuthConfig(registry.AuthConfig{
		Username:      ac.Username,
		Password:      ac.Password,
		ServerAddress: ac.ServerAddress,
		IdentityToken: ac.IdentityToken,
		RegistryToken: ac.RegistryToken,
	})
}

// validImageRef checks, without the engine, that ref can name an image.
func validImageRef(ref string) error {
	_, err := reference.ParseNormalizedNamed(ref)
	return err
}
