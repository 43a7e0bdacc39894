package lifecycle

import (
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Cell is the short form of Apply(from, e) used by the documented matrix: "→ <state>"
// for an allowed move, "=" for a repeat (nothing written), "state_invalid" for
// app_instance_state_invalid and "invalid" for a report that is dropped.
func Cell(from State, e Event) string {
	out, err := Apply(from, e)
	if err == nil {
		if !out.Changed {
			return "="
		}
		return "→ " + string(out.To)
	}
	switch apierr.CodeOf(err) {
	case apierr.AppInstanceStateInvalid:
		return "state_invalid"
	case apierr.InvalidRequest:
		return "invalid"
	}
	return "?"
}

// Matrix renders the whole table (a row per state, a column per event) as the Markdown
// table docs/apps.md carries.
func Matrix() string {
	var b strings.Builder
	b.WriteString("| from \\ event |")
	for _, e := range Events {
		b.WriteString(" " + string(e) + " |")
	}
	b.WriteString("\n|---|")
	for range Events {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range States {
		b.WriteString("| **" + string(s) + "** |")
		for _, e := range Events {
			b.WriteString(" " + Cell(s, e) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}
