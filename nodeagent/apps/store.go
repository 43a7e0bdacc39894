package apps

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
)

func (s *Supervisor) recordPath(id string) string {
	return filepath.Join(s.o.StateDir, "apps", id+".json")
}

func (s *Supervisor) saveRecord(r record) error {
	if s.o.StateDir == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.recordPath(r.InstanceID), b, 0o600)
}

func (s *Supervisor) removeRecord(id string) {
	if s.o.StateDir == "" {
		return
	}
	_ = os.Remove(s.recordPath(id))
	_ = os.Remove(filepath.Join(s.o.StateDir, "apps", id+".log"))
}

// loadRecords reads every instance record; unreadable ones are logged and skipped.
func (s *Supervisor) loadRecords() ([]record, error) {
	if s.o.StateDir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(filepath.Join(s.o.StateDir, "apps"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []record
	for _, e := range entries {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.o.StateDir, "apps", name))
		var r record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && (r.InstanceID != id || !apptask.IsUUID(id)) {
			err = errors.New("the record names another instance")
		}
		if err != nil {
			s.o.Logger.Error("app instance record unreadable; skipped", "file", name, "err", err)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}
