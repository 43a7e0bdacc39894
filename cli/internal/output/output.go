// Package output prints what a read command got: a table for people, or the API's own
// objects as JSON or YAML for scripts. JSON and YAML are the contract's field names and
// values (the generated types marshalled again), so they stay stable as long as the
// contract does; tables may change between versions.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"
)

// Format is the value of -o.
type Format string

const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Parse checks -o.
func Parse(s string) (Format, error) {
	switch f := Format(strings.ToLower(s)); f {
	case Table, JSON, YAML:
		return f, nil
	}
	return "", fmt.Errorf("unknown output format %q: use table, json or yaml", s)
}

// Printer prints one value in the chosen format; the table is built by the caller.
type Printer struct {
	W      io.Writer
	Format Format
}

// Print writes v as JSON or YAML, or calls table with a tab writer for the table.
func (p Printer) Print(v any, table func(t *TableWriter)) error {
	switch p.Format {
	case JSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.W, "%s\n", b)
		return err
	case YAML:
		// Through JSON, so YAML carries exactly the JSON field names and values.
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var generic any
		if err := json.Unmarshal(b, &generic); err != nil {
			return err
		}
		enc := yaml.NewEncoder(p.W)
		enc.SetIndent(2)
		if err := enc.Encode(generic); err != nil {
			return err
		}
		return enc.Close()
	}
	t := &TableWriter{tw: tabwriter.NewWriter(p.W, 0, 0, 2, ' ', 0)}
	table(t)
	return t.tw.Flush()
}

// TableWriter writes aligned columns.
type TableWriter struct{ tw *tabwriter.Writer }

// Row writes one row; the first call is the header.
func (t *TableWriter) Row(cols ...string) {
	for i, c := range cols {
		if c == "" {
			cols[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

// Pairs writes KEY  value lines (a single object's table).
func (t *TableWriter) Pairs(kv ...string) {
	for i := 0; i+1 < len(kv); i += 2 {
		t.Row(kv[i]+":", kv[i+1])
	}
}
