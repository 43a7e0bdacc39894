package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"

	"github.com/gantry-gpu/gantry/shared/alloctask"
)

// Phase is where an allocation stands on this node.
type Phase string

const (
	// PhaseNone: no record (never seen, or the record was lost with the host's disk).
	PhaseNone Phase = ""
	// PhaseProvisioning: a provision or restart started and has not finished; written
	// before the host is touched so that a crash leaves a record to clean up from.
	PhaseProvisioning Phase = "provisioning"
	// PhaseActive: provisioned and runnable; Session answers.
	PhaseActive Phase = "active"
	// PhaseStopped: nothing of the allocation runs and no new session may start; restart
	// and release are still possible.
	PhaseStopped Phase = "stopped"
	// PhaseReleased: everything on the host is gone; the record stays as a tombstone.
	PhaseReleased Phase = "released"
)

// action is the host work a task does from a phase.
type action int

const (
	actNothing   action = iota // the host is already as the task wants it
	actProvision               // create or update the account and its files
	actStop                    // lock the account and stop its processes
	actRestart                 // stop its processes, unlock, re-apply the files
	actRelease                 // remove everything
	actRefuse                  // the task cannot apply (allocation released here)
)

// step is one cell of the transition table: the host work, and the phase after it.
type step struct {
	act  action
	then Phase
}

// transitions is the runtime's state machine: for each phase, what each task kind does.
// Stop and release always do their host work again, even when the record already says
// stopped or released, because the record is written before the work (so a crash or a
// failed command is retried by the next task rather than believed). A provision that
// finds the allocation stopped reports success without unlocking it: the stop came later
// and wins. Nothing leaves released.
var transitions = map[Phase]map[string]step{
	PhaseNone: {
		alloctask.KindProvision: {actProvision, PhaseActive},
		alloctask.KindStop:      {actStop, PhaseStopped},
		alloctask.KindRestart:   {actProvision, PhaseActive},
		alloctask.KindRelease:   {actRelease, PhaseReleased},
	},
	PhaseProvisioning: {
		alloctask.KindProvision: {actProvision, PhaseActive},
		alloctask.KindStop:      {actStop, PhaseStopped},
		alloctask.KindRestart:   {actProvision, PhaseActive},
		alloctask.KindRelease:   {actRelease, PhaseReleased},
	},
	PhaseActive: {
		alloctask.KindProvision: {actProvision, PhaseActive},
		alloctask.KindStop:      {actStop, PhaseStopped},
		alloctask.KindRestart:   {actRestart, PhaseActive},
		alloctask.KindRelease:   {actRelease, PhaseReleased},
	},
	PhaseStopped: {
		alloctask.KindProvision: {actNothing, PhaseStopped},
		alloctask.KindStop:      {actStop, PhaseStopped},
		alloctask.KindRestart:   {actRestart, PhaseActive},
		alloctask.KindRelease:   {actRelease, PhaseReleased},
	},
	PhaseReleased: {
		alloctask.KindProvision: {actRefuse, PhaseReleased},
		alloctask.KindStop:      {actNothing, PhaseReleased},
		alloctask.KindRestart:   {actRefuse, PhaseReleased},
		alloctask.KindRelease:   {actRelease, PhaseReleased},
	},
}

// next looks up the transition table.
func next(from Phase, kind string) (step, error) {
	s, ok := transitions[from][kind]
	if !ok {
		return step{}, fmt.Errorf("runtime: no transition for %q from phase %q", kind, from)
	}
	return s, nil
}

// record is what the runtime keeps on disk per allocation, in
// <state dir>/allocations/<allocation id>.json.
type record struct {
	AllocationID string          `json:"allocation_id"`
	Runtime      string          `json:"runtime"`
	Phase        Phase           `json:"phase"`
	User         string          `json:"user"`
	GPUs         []alloctask.GPU `json:"gpus,omitempty"`
	// Account is filled once a provision succeeded.
	Account   *Account  `json:"account,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// store reads and writes records. Writes are atomic (temporary file, fsync, rename), so a
// crash leaves either the old record or the new one.
type store struct{ dir string }

// maxRecordBytes bounds a record file read back from disk.
const maxRecordBytes = 256 << 10

func (s store) path(id string) string { return filepath.Join(s.dir, id+".json") }

func (s store) init() error { return os.MkdirAll(s.dir, 0o700) }

func (s store) save(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path(r.AllocationID), append(b, '\n'), 0o600)
}

func (s store) remove(id string) error {
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// all reads every record. A file that is not a record (a leftover temporary file, a
// workspace directory) is skipped; a record that does not parse is an error, because
// acting as if the allocation were unknown could hand its account to someone else.
func (s store) all() ([]*record, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []*record
	for _, e := range entries {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !e.Type().IsRegular() || !uuidLike(id) {
			continue
		}
		b, err := readFileLimited(filepath.Join(s.dir, name), maxRecordBytes)
		if err != nil {
			return nil, err
		}
		var r record
		if err := json.Unmarshal(b, &r); err != nil || r.AllocationID != id {
			return nil, fmt.Errorf("runtime: state file %s is not a valid record", filepath.Join(s.dir, name))
		}
		out = append(out, &r)
	}
	return out, nil
}

func uuidLike(s string) bool {
	return (alloctask.Payload{AllocationID: s, User: "x"}).Validate() == nil
}
