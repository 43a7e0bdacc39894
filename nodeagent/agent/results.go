package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

// resultStore keeps the results the control plane has not acknowledged yet on disk, one
// file per task (<state dir>/results/<task id>.pb), from the moment the task finishes
// until the TaskResultAck arrives: a control plane that dies after the result went down
// the tunnel but before it committed it, and an agent killed before it sent it, both find
// the result again (docs/nodeagent.md, "Task results"). Writes are atomic (temporary
// file, fsync, rename). The zero value (no directory) keeps nothing on disk.
type resultStore struct{ dir string }

// maxResultBytes bounds a result file read back from disk.
const maxResultBytes = 1 << 20

// resultFileID is how a task id becomes a file name: ids are the control plane's UUIDs,
// but the agent takes any id up to 128 bytes, so anything that is not a plain name is
// hex-encoded.
func resultFileID(id string) string {
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Sprintf("x%x", id)
		}
	}
	return "t" + id
}

func (s resultStore) path(id string) string {
	return filepath.Join(s.dir, resultFileID(id)+".pb")
}

func (s resultStore) init() error {
	if s.dir == "" {
		return nil
	}
	return os.MkdirAll(s.dir, 0o700)
}

// save writes r durably before it is offered to the tunnel.
func (s resultStore) save(r *fabricv1.TaskResult) error {
	if s.dir == "" {
		return nil
	}
	b, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path(r.GetTaskId()), b, 0o600)
}

// remove forgets an acknowledged result.
func (s resultStore) remove(id string) error {
	if s.dir == "" {
		return nil
	}
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// all reads every pending result. Leftover temporary files are skipped. A file that is
// not a valid result (a damaged disk, a hand edit) is renamed aside to a hidden
// ".bad-" name and listed in bad, not fatal: an agent that refused to start over it
// would strand every other workload on the node, while the control plane still
// settles that one task through its report timeout and the reconcile on connect. The
// file is kept for an operator to look at.
func (s resultStore) all() (out []*fabricv1.TaskResult, bad []string, err error) {
	if s.dir == "" {
		return nil, nil, nil
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".pb") || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(s.dir, name)
		r, err := s.read(path, e)
		if err != nil {
			aside := filepath.Join(s.dir, ".bad-"+name)
			if rerr := os.Rename(path, aside); rerr != nil {
				return nil, nil, fmt.Errorf("agent: result file %s: %v; moving it aside: %w", path, err, rerr)
			}
			bad = append(bad, aside)
			continue
		}
		out = append(out, r)
	}
	return out, bad, nil
}

// read parses one result file; its name must be the one its task id maps to.
func (s resultStore) read(path string, e fs.DirEntry) (*fabricv1.TaskResult, error) {
	info, err := e.Info()
	if err != nil {
		return nil, err
	}
	if info.Size() > maxResultBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxResultBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r fabricv1.TaskResult
	if err := proto.Unmarshal(b, &r); err != nil || r.GetTaskId() == "" || s.path(r.GetTaskId()) != path {
		return nil, errors.New("not a valid task result")
	}
	return &r, nil
}
