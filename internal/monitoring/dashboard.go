package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Dashboard is the part of a Grafana dashboard model (JSON, schemaVersion
// 39 and later: panels at the top level, rows as panels of type "row")
// that LoadDashboard checks.
type Dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Panels        []Panel
	Templating    struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is one panel; a row (Type "row") holds its collapsed panels in
// Panels.
type Panel struct {
	ID         *int           `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	GridPos    *GridPos       `json:"gridPos"`
	Datasource *DatasourceRef `json:"datasource"`
	Targets    []Target       `json:"targets"`
	Panels     []Panel        `json:"panels"`
	Collapsed  bool           `json:"collapsed"`
}

// GridPos places a panel on Grafana's 24-column grid; H is in grid rows
// (30 px each).
type GridPos struct {
	H, W, X, Y int
}

// DatasourceRef names a data source by type and uid; a uid of the form
// ${name} refers to a dashboard variable.
type DatasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// Target is one query of a panel.
type Target struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *DatasourceRef `json:"datasource"`
}

// Variable is one templating variable.
type Variable struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Query any    `json:"query"`
}

// Expr is one PromQL expression and where it stands (for messages).
type Expr struct {
	Where string
	Expr  string
}

// registerPlugins registers the Grafana Foundation SDK's panel and query
// variants (timeseries, stat, prometheus...) once, so that its strict
// decoding checks panels' options and targets too.
var registerPlugins = sync.OnceFunc(plugins.RegisterDefaultPlugins)

// grafanaSchema decodes data strictly into the Grafana Foundation SDK's
// dashboard model (generated from Grafana's own schema): an unknown field
// anywhere, a missing required one, or a value of the wrong type is an
// error; so is a model that fails the SDK's validation.
func grafanaSchema(data []byte) error {
	registerPlugins()
	var d dashboard.Dashboard
	// The SDK returns its error list as a typed nil when there is none.
	failed := func(err error) bool {
		var be cog.BuildErrors
		return err != nil && (!errors.As(err, &be) || len(be) > 0)
	}
	if err := d.UnmarshalJSONStrict(data); failed(err) {
		return fmt.Errorf("not a Grafana dashboard model: %w", err)
	}
	if err := d.Validate(); failed(err) {
		return fmt.Errorf("Grafana dashboard model: %w", err)
	}
	return nil
}

// LoadDashboard reads a dashboard file and checks that Grafana can load it
// as we mean it: Grafana's dashboard schema, strictly (grafanaSchema), and
// valid JSON with a uid, a title and schemaVersion >= 39;
// a datasource variable of type prometheus that every query panel and
// target refers to (${name}); every panel (rows' nested panels too) with a
// unique numeric id, a type, a title and a gridPos inside the 24 columns
// that overlaps no other panel; every non-row panel with at least one
// target, each with a refId unique in its panel and a non-empty expr. All
// problems are returned joined, each naming the panel.
func LoadDashboard(path string) (*Dashboard, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var d Dashboard
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: not a JSON dashboard: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the dashboard object", path)
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := grafanaSchema(data); err != nil {
		errs = append(errs, err)
	}
	if d.UID == "" || d.Title == "" {
		bad("uid %q and title %q must both be set", d.UID, d.Title)
	}
	if d.SchemaVersion < 39 {
		bad("schemaVersion %d: want 39 or later (Grafana 10.4+)", d.SchemaVersion)
	}
	dsVar := ""
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			if q, _ := v.Query.(string); q != "prometheus" {
				bad("datasource variable %q: query %v, want prometheus", v.Name, v.Query)
			}
			dsVar = v.Name
		}
	}
	if dsVar == "" {
		bad("no datasource variable (templating.list entry of type datasource)")
	}
	wantDS := "${" + dsVar + "}"
	checkDS := func(where string, ds *DatasourceRef) {
		if ds == nil || ds.UID != wantDS || ds.Type != "prometheus" {
			bad("%s: datasource %+v, want {type: prometheus, uid: %s}", where, ds, wantDS)
		}
	}
	ids := map[int]string{}
	var placed []Panel
	var walk func(ps []Panel, in string)
	walk = func(ps []Panel, in string) {
		for i, p := range ps {
			where := fmt.Sprintf("panel %d%s %q", i, in, p.Title)
			if p.ID == nil {
				bad("%s: no id", where)
			} else if prev, dup := ids[*p.ID]; dup {
				bad("%s: id %d already used by %s", where, *p.ID, prev)
			} else {
				ids[*p.ID] = where
				where = fmt.Sprintf("panel id %d %q", *p.ID, p.Title)
			}
			if p.Type == "" || p.Title == "" {
				bad("%s: type %q and title %q must both be set", where, p.Type, p.Title)
			}
			if g := p.GridPos; g == nil {
				bad("%s: no gridPos", where)
			} else if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
				bad("%s: gridPos %+v outside the 24-column grid", where, *g)
			} else if in == "" {
				// Panels of collapsed rows are laid out when the row opens.
				for _, q := range placed {
					if overlap(*g, *q.GridPos) {
						bad("%s: gridPos %+v overlaps panel %q at %+v", where, *g, q.Title, *q.GridPos)
					}
				}
				placed = append(placed, p)
			}
			if p.Type == "row" {
				if len(p.Targets) > 0 {
					bad("%s: a row has no targets", where)
				}
				if !p.Collapsed && len(p.Panels) > 0 {
					bad("%s: an expanded row keeps its panels at the top level, not in panels", where)
				}
				walk(p.Panels, fmt.Sprintf(" (in collapsed row %q)", p.Title))
				continue
			}
			if len(p.Panels) > 0 {
				bad("%s: only rows hold panels", where)
			}
			checkDS(where, p.Datasource)
			if len(p.Targets) == 0 {
				bad("%s: no targets", where)
			}
			refs := map[string]bool{}
			for j, t := range p.Targets {
				tw := fmt.Sprintf("%s target %d", where, j)
				if t.RefID == "" || refs[t.RefID] {
					bad("%s: refId %q empty or used twice", tw, t.RefID)
				}
				refs[t.RefID] = true
				if strings.TrimSpace(t.Expr) == "" {
					bad("%s: no expr", tw)
				}
				checkDS(tw, t.Datasource)
			}
		}
	}
	walk(d.Panels, "")
	if len(ids) == 0 {
		bad("no panels")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// overlap reports whether two grid rectangles share a cell.
func overlap(a, b GridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// Exprs returns every target's expression, rows' nested panels included,
// in panel order.
func (d *Dashboard) Exprs() []Expr {
	var out []Expr
	var walk func(ps []Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Expr{Where: fmt.Sprintf("dashboard panel %q target %s", p.Title, t.RefID), Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// VariableExprs returns the selector inside label_values(SELECTOR, label)
// or query_result(EXPR) of every query variable; other variable queries
// (label_names(), metrics(...)) select no series and are skipped.
func (d *Dashboard) VariableExprs() []Expr {
	var out []Expr
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		q = strings.TrimSpace(q)
		switch {
		case strings.HasPrefix(q, "label_values(") && strings.HasSuffix(q, ")"):
			inner := q[len("label_values(") : len(q)-1]
			if i := strings.LastIndexByte(inner, ','); i >= 0 {
				inner = inner[:i]
			}
			out = append(out, Expr{Where: "dashboard variable " + v.Name, Expr: inner})
		case strings.HasPrefix(q, "query_result(") && strings.HasSuffix(q, ")"):
			out = append(out, Expr{Where: "dashboard variable " + v.Name, Expr: q[len("query_result(") : len(q)-1]})
		}
	}
	return out
}

// Titles returns every panel's title, rows' nested panels included.
func (d *Dashboard) Titles() []string {
	var out []string
	var walk func(ps []Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p.Title)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// grafanaVars are the values Grafana's built-in interval variables are
// replaced with for promtool's syntax check.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${__rate_interval}", "5m",
	"$__interval", "1m", "${__interval}", "1m", "$__range", "1h", "${__range}", "1h")

// Substitute returns expr with Grafana's interval variables replaced by
// durations and every other $name or ${name} variable by ".*" (they only
// stand in label matcher values), so that promtool can parse it.
func Substitute(expr string) string {
	s := grafanaVars.Replace(expr)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		l := lexer{s: s, i: i}
		l.skipVariable()
		b.WriteString(".*")
		i = l.i - 1
	}
	return b.String()
}
