package observability

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Route is a node of Alertmanager's routing tree, as much of it as deciding where an
// alert goes needs: its receiver, matchers, children and continue.
type Route struct {
	Receiver string
	Matchers []Matcher
	Continue bool
	Routes   []*Route
}

// Routing is the part of an Alertmanager configuration the alerts read model uses:
// the tree, and which receivers deliver somewhere (a receiver with no integration,
// such as the root's `unrouted`, delivers nowhere).
type Routing struct {
	Root       *Route
	Delivering map[string]bool
}

// Matcher is one label matcher of a route (`name="v"`, `!=`, `=~`, `!~`).
type Matcher struct {
	Name  string
	Op    string
	Value string
	re    *regexp.Regexp
}

// Matches applies Alertmanager's semantics: a missing label is the empty string, and
// regular expressions are anchored.
func (m Matcher) Matches(labels map[string]string) bool {
	v := labels[m.Name]
	switch m.Op {
	case "=":
		return v == m.Value
	case "!=":
		return v != m.Value
	case "=~":
		return m.re.MatchString(v)
	default: // "!~"
		return !m.re.MatchString(v)
	}
}

var matcherPattern = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$`)

// ParseMatcher parses the matcher syntax of Alertmanager's `matchers:` lists.
func ParseMatcher(s string) (Matcher, error) {
	p := matcherPattern.FindStringSubmatch(s)
	if p == nil {
		return Matcher{}, fmt.Errorf("matcher %q: not name op value", s)
	}
	m := Matcher{Name: p[1], Op: p[2], Value: p[3]}
	if strings.HasPrefix(m.Value, `"`) {
		v, err := strconv.Unquote(m.Value)
		if err != nil {
			return Matcher{}, fmt.Errorf("matcher %q: %w", s, err)
		}
		m.Value = v
	}
	return m.compile()
}

func (m Matcher) compile() (Matcher, error) {
	if m.Op == "=~" || m.Op == "!~" {
		re, err := regexp.Compile("^(?:" + m.Value + ")$")
		if err != nil {
			return Matcher{}, fmt.Errorf("matcher %s: %w", m.Name, err)
		}
		m.re = re
	}
	return m, nil
}

type routeYAML struct {
	Receiver string            `yaml:"receiver"`
	Matchers []string          `yaml:"matchers"`
	Match    map[string]string `yaml:"match"`
	MatchRE  map[string]string `yaml:"match_re"`
	Continue bool              `yaml:"continue"`
	Routes   []routeYAML       `yaml:"routes"`
}

// ParseRouting reads the route tree and receivers of an Alertmanager configuration
// (the file, or the `config.original` its status API returns).
func ParseRouting(raw []byte) (*Routing, error) {
	var doc struct {
		Route     *routeYAML `yaml:"route"`
		Receivers []map[string]any
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if doc.Route == nil || doc.Route.Receiver == "" {
		return nil, fmt.Errorf("no route with a receiver")
	}
	root, err := buildRoute(*doc.Route, "")
	if err != nil {
		return nil, err
	}
	out := &Routing{Root: root, Delivering: map[string]bool{}}
	for _, rc := range doc.Receivers {
		name, _ := rc["name"].(string)
		for k, v := range rc {
			if strings.HasSuffix(k, "_configs") {
				if list, ok := v.([]any); ok && len(list) > 0 {
					out.Delivering[name] = true
				}
			}
		}
	}
	return out, nil
}

func buildRoute(y routeYAML, parentReceiver string) (*Route, error) {
	r := &Route{Receiver: y.Receiver, Continue: y.Continue}
	if r.Receiver == "" {
		r.Receiver = parentReceiver // a child inherits its parent's receiver
	}
	for _, s := range y.Matchers {
		m, err := ParseMatcher(s)
		if err != nil {
			return nil, err
		}
		r.Matchers = append(r.Matchers, m)
	}
	for k, v := range y.Match {
		r.Matchers = append(r.Matchers, Matcher{Name: k, Op: "=", Value: v})
	}
	for k, v := range y.MatchRE {
		m, err := Matcher{Name: k, Op: "=~", Value: v}.compile()
		if err != nil {
			return nil, err
		}
		r.Matchers = append(r.Matchers, m)
	}
	for _, c := range y.Routes {
		child, err := buildRoute(c, r.Receiver)
		if err != nil {
			return nil, err
		}
		r.Routes = append(r.Routes, child)
	}
	return r, nil
}

// Receivers returns the receivers an alert with labels reaches, in Alertmanager's
// order: depth first, the first matching child wins unless it has continue, and a
// node none of whose children match takes the alert itself.
func (r *Route) Receivers(labels map[string]string) []string {
	var out []string
	r.walk(labels, &out)
	return out
}

func (r *Route) matches(labels map[string]string) bool {
	for _, m := range r.Matchers {
		if !m.Matches(labels) {
			return false
		}
	}
	return true
}

func (r *Route) walk(labels map[string]string, out *[]string) {
	matched := false
	for _, c := range r.Routes {
		if !c.matches(labels) {
			continue
		}
		c.walk(labels, out)
		matched = true
		if !c.Continue {
			break
		}
	}
	if !matched {
		*out = append(*out, r.Receiver)
	}
}

// parseWindow reads an SLO window or a range such as 30d, 7d, 24h, 6h, 1h.
func parseWindow(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.Atoi(n)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("window %q", s)
		}
		return time.Duration(d) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("window %q", s)
	}
	return d, nil
}
