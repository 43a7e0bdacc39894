package lifecycle

import (
	"strings"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Cell is the short form of Apply(from, e) used by the documented matrix:
// "→ <status>" for an allowed move, "=" for a repeat (nothing written), and for a
// refusal the contract code without its "allocation_" prefix ("not_active",
// "already_releasing") or "invalid" for 409 invalid_request.
func Cell(from Status, e Event) string {
	out, err := Apply(from, e)
	if err == nil {
		if !out.Changed {
			return "="
		}
		return "→ " + string(out.To)
	}
	switch apierr.CodeOf(err) {
	case apierr.AllocationNotActive:
		return "not_active"
	case apierr.AllocationAlreadyReleasing:
		return "already_releasing"
	case apierr.InvalidRequest:
		return "invalid"
	}
	return "?"
}

// Matrix renders the whole table (a row per status, a column per event) as the
// Markdown table docs/allocation-lifecycle.md carries.
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
	for _, s := range Statuses {
		b.WriteString("| **" + string(s) + "** |")
		for _, e := range Events {
			b.WriteString(" " + Cell(s, e) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}
