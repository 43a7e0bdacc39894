package gateway

import (
	"errors"
	"slices"
	"strconv"
	"strings"
)

// NodeLabel is the label the gateway stamps with the authenticated node's id.
const NodeLabel = "node_id"

// Limits on what a node may claim, so one stream cannot cost more to relabel than to
// carry. Loki's own defaults are stricter (15 names); these only bound our work.
const (
	maxLabels         = 64
	maxLabelNameLen   = 1024
	maxLabelValueLen  = 2048
	maxLabelStringLen = 16 << 10
)

var errLabels = errors.New("malformed stream labels")

// Label is one name="value" pair.
type Label struct{ Name, Value string }

// ParseLabels reads a Prometheus-style label set as Loki's push format carries it:
// {name="value", other="escaped \"value\""}.
func ParseLabels(s string) ([]Label, error) {
	if len(s) > maxLabelStringLen {
		return nil, errLabels
	}
	s = strings.TrimSpace(s)
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, errLabels
	}
	rest := s[1 : len(s)-1]
	var out []Label
	for {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return out, nil
		}
		n := nameLen(rest)
		if n == 0 || n > maxLabelNameLen {
			return nil, errLabels
		}
		name := rest[:n]
		rest = strings.TrimLeft(rest[n:], " \t")
		if rest == "" || rest[0] != '=' {
			return nil, errLabels
		}
		rest = strings.TrimLeft(rest[1:], " \t")
		if rest == "" || rest[0] != '"' {
			return nil, errLabels
		}
		quoted, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return nil, errLabels
		}
		value, err := unquote(quoted)
		if err != nil || len(value) > maxLabelValueLen {
			return nil, errLabels
		}
		if len(out) == maxLabels {
			return nil, errLabels
		}
		out = append(out, Label{Name: name, Value: value})
		rest = strings.TrimLeft(rest[len(quoted):], " \t")
		if rest == "" {
			return out, nil
		}
		if rest[0] != ',' {
			return nil, errLabels
		}
		rest = rest[1:]
	}
}

// unquote avoids strconv.Unquote's copy for the common value without escapes.
func unquote(q string) (string, error) {
	if strings.IndexByte(q, '\\') < 0 {
		return q[1 : len(q)-1], nil
	}
	return strconv.Unquote(q)
}

// nameLen is the length of the label name [a-zA-Z_][a-zA-Z0-9_]* at the start of s.
func nameLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'):
		case c >= '0' && c <= '9' && i > 0:
		default:
			return i
		}
	}
	return len(s)
}

// StampNode returns the label string of labels with node_id set to node, whatever the
// node claimed (a claimed node_id is replaced, never kept beside), sorted by name and
// without duplicate names (the last claim of a name wins, as in Loki).
func StampNode(labels []Label, node string) string {
	out := make([]Label, 0, len(labels)+1)
	for _, l := range labels {
		if l.Name == NodeLabel {
			continue
		}
		out = append(out, l)
	}
	out = append(out, Label{Name: NodeLabel, Value: node})
	slices.SortStableFunc(out, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
	// Keep the last of each run of equal names.
	dedup := out[:0]
	for i, l := range out {
		if i+1 < len(out) && out[i+1].Name == l.Name {
			continue
		}
		dedup = append(dedup, l)
	}
	return FormatLabels(dedup)
}

// FormatLabels renders labels as {a="x", b="y"} in the given order.
func FormatLabels(labels []Label) string {
	var b strings.Builder
	n := 2
	for _, l := range labels {
		n += len(l.Name) + len(l.Value) + 5
	}
	b.Grow(n)
	b.WriteByte('{')
	for i, l := range labels {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(l.Name)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(l.Value))
	}
	b.WriteByte('}')
	return b.String()
}
