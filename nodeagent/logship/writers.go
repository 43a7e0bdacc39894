package logship

import (
	"bytes"
	"log/slog"
	"sync"

	"github.com/grafana/loki/pkg/push"
)

// Task output streams (the stream label of a task's lines).
const (
	StreamAgent     = "agent"
	StreamProvision = "provision"
	StreamRelease   = "release"
	StreamRuntime   = "runtime"
	StreamJournal   = "journal"
)

// LineWriter turns written bytes into log lines of one stream: one line per '\n', a line
// longer than MaxLineBytes split, the unterminated rest sent on Close. It never blocks.
type LineWriter struct {
	s      *Shipper
	stream Stream
	meta   []push.LabelAdapter

	mu  sync.Mutex
	buf []byte
}

// Writer returns a writer whose lines go to stream, each with the given structured
// metadata.
func (s *Shipper) Writer(st Stream, meta ...push.LabelAdapter) *LineWriter {
	return &LineWriter{s: s, stream: st, meta: meta}
}

// TaskWriter is where a task's output goes: stream is provision, release or runtime, and
// task_id travels as structured metadata rather than a label, so every task does not
// become a Loki stream of its own.
func (s *Shipper) TaskWriter(stream, taskID string) *LineWriter {
	return s.Writer(s.Stream(map[string]string{"stream": stream}), push.LabelAdapter{Name: "task_id", Value: taskID})
}

func (w *LineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) >= w.s.cfg.MaxLineBytes {
				w.emit(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		if len(w.buf) > 0 {
			w.buf = append(w.buf, p[:i]...)
			w.emit(w.buf)
			w.buf = w.buf[:0]
		} else {
			w.emit(p[:i])
		}
		p = p[i+1:]
	}
	return n, nil
}

// Close sends an unterminated last line.
func (w *LineWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(w.buf)
		w.buf = nil
	}
	return nil
}

func (w *LineWriter) emit(line []byte) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	w.s.Log(w.stream, string(line), w.meta...)
}

// SlogHandler returns a handler that ships the agent's own log records as JSON lines to
// stream="agent". Combine it with the agent's console handler to log to both.
func (s *Shipper) SlogHandler(opts *slog.HandlerOptions) slog.Handler {
	return slog.NewJSONHandler(s.Writer(s.Stream(map[string]string{"stream": StreamAgent})), opts)
}
