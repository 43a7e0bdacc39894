package terminal

import (
	"encoding/json"
	"testing"

	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/termproto"
)

// FuzzParseClientFrame feeds arbitrary text frames from the browser to the parser the
// bridge uses. Properties: no panic; a refusal is invalid_request (reason
// bad_control_frame) or validation_error on cols, never anything the session would die
// of; an accepted frame is a ping or a resize whose cols and rows lie in
// [minSize, maxSize], so the uint16 fields of the agent's resize frame hold them exactly
// (a resize of 65537 columns must not reach the PTY as 1); and an accepted frame encodes
// and parses back to itself.
func FuzzParseClientFrame(f *testing.F) {
	f.Add([]byte(`{"type":"resize","cols":120,"rows":40}`))
	f.Add([]byte(`{"type":"resize","cols":65537,"rows":1}`))
	f.Add([]byte(`{"type":"resize","cols":-1,"rows":1000}`))
	f.Add([]byte(`{"type":"ping"}`))
	f.Add([]byte(`{"type":"close"}`))
	f.Add([]byte(`{"type":"resize","cols":1e3,"rows":1}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, p []byte) {
		fr, err := parseClientFrame(p)
		if err != nil {
			e, ok := apierr.As(err)
			switch {
			case !ok:
				t.Fatalf("refusal %v is not an API error", err)
			case e.Code == apierr.InvalidRequest && e.Details["reason"] == "bad_control_frame":
			case e.Code == apierr.ValidationError && e.Details["field"] == "cols":
			default:
				t.Fatalf("refusal %s %v", e.Code, e.Details)
			}
			return
		}
		switch fr.Type {
		case framePing:
		case frameResize:
			if fr.Cols < minSize || fr.Cols > maxSize || fr.Rows < minSize || fr.Rows > maxSize ||
				int(uint16(fr.Cols)) != fr.Cols || int(uint16(fr.Rows)) != fr.Rows {
				t.Fatalf("resize %dx%d accepted", fr.Cols, fr.Rows)
			}
			c := termproto.Control{Type: termproto.TypeResize, Cols: uint16(fr.Cols), Rows: uint16(fr.Rows)}
			if int(c.Cols) != fr.Cols || int(c.Rows) != fr.Rows {
				t.Fatalf("resize %dx%d becomes %dx%d toward the agent", fr.Cols, fr.Rows, c.Cols, c.Rows)
			}
		default:
			t.Fatalf("frame type %q accepted", fr.Type)
		}
		b, err := json.Marshal(fr)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := parseClientFrame(b); err != nil || again != fr {
			t.Fatalf("%s parses to %+v (%v), want %+v", b, again, err, fr)
		}
	})
}
