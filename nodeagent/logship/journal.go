package logship

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"github.com/grafana/loki/pkg/push"
)

// unitName is what FollowJournal accepts as a systemd unit name.
var unitName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9@._:\\-]{0,255}$`)

// FollowJournal ships the journal of one systemd unit (stream="journal", unit=<unit>)
// by following `journalctl -f -o json -u <unit>`, until ctx ends. When journalctl exits
// it is started again after a backoff, resuming after the last entry it delivered.
func (s *Shipper) FollowJournal(ctx context.Context, unit string) error {
	if !unitName.MatchString(unit) {
		return fmt.Errorf("logship: %q is not a unit name", unit)
	}
	if _, err := exec.LookPath(s.cfg.Journalctl); err != nil {
		return fmt.Errorf("logship: journald: %w", err)
	}
	st := s.Stream(map[string]string{"stream": StreamJournal, "unit": unit})
	cursor := ""
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		started := s.cfg.Clock.Now()
		var err error
		cursor, err = s.followOnce(ctx, unit, cursor, st)
		if ctx.Err() != nil {
			return nil
		}
		if s.cfg.Clock.Now().Sub(started) > time.Minute {
			backoff = s.cfg.MinBackoff
		}
		s.cfg.Logger.Debug("journalctl exited; restarting", "unit", unit, "error", err)
		if s.cfg.Sleep(ctx, jitter(backoff)) != nil {
			return nil
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	return nil
}

func (s *Shipper) followOnce(ctx context.Context, unit, cursor string, st Stream) (string, error) {
	args := []string{"-f", "-o", "json", "-u", unit}
	if cursor != "" {
		args = append(args, "--after-cursor", cursor)
	} else {
		args = append(args, "-n", "0")
	}
	cmd := exec.CommandContext(ctx, s.cfg.Journalctl, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return cursor, err
	}
	if err := cmd.Start(); err != nil {
		return cursor, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		e, ok := parseJournal(sc.Bytes())
		if !ok {
			continue
		}
		if e.cursor != "" {
			cursor = e.cursor
		}
		var meta []push.LabelAdapter
		if e.priority != "" {
			meta = []push.LabelAdapter{{Name: "priority", Value: e.priority}}
		}
		ts := e.ts
		if ts.IsZero() {
			ts = s.cfg.Clock.Now()
		}
		s.LogAt(st, ts, e.message, meta...)
	}
	werr := cmd.Wait()
	return cursor, errors.Join(sc.Err(), werr)
}

type journalEntry struct {
	message  string
	ts       time.Time
	priority string
	cursor   string
}

// parseJournal reads one line of `journalctl -o json`. MESSAGE is a string, or an array
// of bytes when it is not valid UTF-8.
func parseJournal(line []byte) (journalEntry, bool) {
	var raw struct {
		Message  json.RawMessage `json:"MESSAGE"`
		Realtime string          `json:"__REALTIME_TIMESTAMP"`
		Priority string          `json:"PRIORITY"`
		Cursor   string          `json:"__CURSOR"`
	}
	if json.Unmarshal(line, &raw) != nil {
		return journalEntry{}, false
	}
	e := journalEntry{priority: raw.Priority, cursor: raw.Cursor}
	var str string
	var bytesMsg []byte
	switch {
	case json.Unmarshal(raw.Message, &str) == nil:
		e.message = str
	case json.Unmarshal(raw.Message, &bytesMsg) == nil:
		e.message = string(bytesMsg)
	default:
		return journalEntry{}, false
	}
	if us, err := strconv.ParseInt(raw.Realtime, 10, 64); err == nil {
		e.ts = time.UnixMicro(us).UTC()
	}
	return e, true
}
