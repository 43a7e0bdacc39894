package apps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// Artifacts an instance was launched with are placed read-only in its directory before
// its first process starts: {instance_dir}/artifacts/<name>/<path>. The bytes come from
// the control plane over this agent's own fabric tunnel (AppArtifactFabric), never from
// anywhere else, and every file is checked against the size and SHA-256 the app.start
// task pinned; a mismatch fails the start (artifact_digest_mismatch) and the app never
// runs on bytes nobody vouched for. The files are a verified copy, not a live mount:
// an artifact is immutable once launched with (its digests are pinned), so a copy is
// what a mount would show, and it survives the tunnel going down.
//
// Read-only: files are 0444 and directories 0555, created by the agent (root on a
// real node, so the allocation's user can neither change nor remove them; under the
// process runtime, which runs everything as one user, only the modes hold).

// ArtifactSource reads one file of an instance's artifact from the control plane.
type ArtifactSource interface {
	ReadArtifact(ctx context.Context, instanceID, artifactID, path string) (io.ReadCloser, error)
}

// FabricArtifacts reads through AppArtifactFabric on the agent's current tunnel; Conn
// waits for one (storagemount.Conns.Wait).
type FabricArtifacts struct {
	Conn func(ctx context.Context) (grpc.ClientConnInterface, error)
}

// ReadArtifact implements ArtifactSource.
func (f FabricArtifacts) ReadArtifact(ctx context.Context, instanceID, artifactID, path string) (io.ReadCloser, error) {
	cc, err := f.Conn(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	st, err := fabricv1.NewAppArtifactFabricClient(cc).Read(ctx, &fabricv1.AppArtifactReadRequest{
		AppInstanceId: instanceID, ArtifactId: artifactID, Path: path})
	if err != nil {
		cancel()
		return nil, err
	}
	return &chunkReader{st: st, cancel: cancel}, nil
}

// chunkReader is a Read stream as an io.Reader.
type chunkReader struct {
	st     fabricv1.AppArtifactFabric_ReadClient
	cancel context.CancelFunc
	buf    []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		m, err := c.st.Recv()
		if err != nil {
			return 0, err // io.EOF at the end
		}
		c.buf = m.GetData()
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *chunkReader) Close() error { c.cancel(); return nil }

// artifactError is a failed placement: the task error code (= the failed reason).
type artifactError struct {
	code string
	err  error
}

func (e *artifactError) Error() string { return e.err.Error() }
func (e *artifactError) Unwrap() error { return e.err }

// placeArtifacts fetches, verifies and places the spec's artifacts under
// instanceDir/artifacts, replacing whatever an earlier attempt left there. Nothing is
// visible under that name until every file matched.
func placeArtifacts(ctx context.Context, src ArtifactSource, spec *fabricv1.AppStartTask, instanceDir string) error {
	arts := spec.GetArtifacts()
	final := filepath.Join(instanceDir, apptask.ArtifactsDir)
	partial := final + ".partial"
	for _, d := range []string{partial, final} {
		if err := removeReadOnly(d); err != nil {
			return &artifactError{apptask.CodeStartFailed, fmt.Errorf("clear %s: %w", d, err)}
		}
	}
	if len(arts) == 0 {
		return nil
	}
	if src == nil {
		return &artifactError{apptask.CodeArtifactUnavailable, errors.New("this agent has no artifact source")}
	}
	if err := os.Mkdir(partial, 0o755); err != nil { // fails on anything placed there meanwhile
		return &artifactError{apptask.CodeStartFailed, err}
	}
	for _, a := range arts {
		dir := filepath.Join(partial, a.GetName())
		if err := os.Mkdir(dir, 0o755); err != nil {
			return &artifactError{apptask.CodeStartFailed, err}
		}
		for _, f := range a.GetFiles() {
			if err := placeFile(ctx, src, spec.GetAppInstanceId(), a, f, dir); err != nil {
				_ = removeReadOnly(partial)
				return err
			}
		}
	}
	if err := sealReadOnly(partial); err != nil {
		return &artifactError{apptask.CodeStartFailed, err}
	}
	if err := os.Rename(partial, final); err != nil {
		return &artifactError{apptask.CodeStartFailed, err}
	}
	return nil
}

func placeFile(ctx context.Context, src ArtifactSource, instanceID string, a *fabricv1.AppArtifactMount, f *fabricv1.AppArtifactFile, dir string) error {
	where := fmt.Sprintf("artifact %s@%s file %s", a.GetName(), a.GetVersion(), f.GetPath())
	target := filepath.Join(dir, filepath.FromSlash(f.GetPath()))
	if !strings.HasPrefix(target, dir+string(filepath.Separator)) { // ValidateStart forbids it; never write outside
		return &artifactError{apptask.CodeInvalidPayload, fmt.Errorf("%s: path escapes the artifact", where)}
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return &artifactError{apptask.CodeStartFailed, fmt.Errorf("%s: %w", where, err)}
	}
	rc, err := src.ReadArtifact(ctx, instanceID, a.GetArtifactId(), f.GetPath())
	if err != nil {
		return fetchError(where, err)
	}
	defer rc.Close()
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return &artifactError{apptask.CodeStartFailed, fmt.Errorf("%s: %w", where, err)}
	}
	h := sha256.New()
	// One byte past the size tells a longer body from an exact one.
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(rc, f.GetSizeBytes()+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fetchError(where, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != f.GetSizeBytes() || got != f.GetSha256() {
		return &artifactError{apptask.CodeArtifactDigestMismatch,
			fmt.Errorf("%s: %d bytes with sha256:%s, want %d bytes with sha256:%s (pinned at launch)", where, n, got, f.GetSizeBytes(), f.GetSha256())}
	}
	return nil
}

// fetchError maps a failed read: the control plane's DATA_LOSS (its stored bytes do not
// match their digest) is a digest mismatch; anything else is unavailable.
func fetchError(where string, err error) error {
	if status.Code(err) == codes.DataLoss {
		return &artifactError{apptask.CodeArtifactDigestMismatch, fmt.Errorf("%s: the control plane's stored bytes do not match their digest", where)}
	}
	return &artifactError{apptask.CodeArtifactUnavailable, fmt.Errorf("%s: %w", where, err)}
}

// sealReadOnly makes files 0444 and directories 0555, deepest first.
func sealReadOnly(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return fmt.Errorf("unexpected symlink %s", p)
		}
		if d.IsDir() {
			dirs = append(dirs, p)
			return nil
		}
		return os.Chmod(p, 0o444)
	})
	if err != nil {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
	for _, d := range dirs {
		if err := os.Chmod(d, 0o555); err != nil {
			return err
		}
	}
	return nil
}

// removeReadOnly removes root (a tree sealReadOnly made) after giving its directories
// back their write bit; a missing root is fine. Symlinks are removed, never followed.
func removeReadOnly(root string) error {
	fi, err := os.Lstat(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	}
	return os.RemoveAll(root)
}
