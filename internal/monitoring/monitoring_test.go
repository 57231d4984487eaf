package monitoring

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`tether_a_total`, []string{"tether_a_total"}},
		{`sum by (instance, reason) (rate(tether_a_total{reason!="duplicate"}[10m])) > 0.05`, []string{"tether_a_total"}},
		{`sum(rate(a[5m])) by (node) / ignoring(x) group_left(y) sum without (le) (b)`, []string{"a", "b"}},
		{`histogram_quantile(0.99, sum by (le) (rate(tether_h_bucket{job=~"$job"}[$__rate_interval])))`, []string{"tether_h_bucket"}},
		{`count(x == 0) or vector(0)`, []string{"x"}},
		{`{__name__="tether_q", a="b"}`, []string{"tether_q"}},
		{`{"tether_utf8", a="b"}`, []string{"tether_utf8"}},
		{`max_over_time(a[1h:5m] offset 1h) - a @ end()`, []string{"a"}},
		{`label_replace(a, "dst", "$1", "src", "(by|sum)")`, []string{"a"}},
		{`topk(5, a) unless on(node) b and bool c`, []string{"a", "b", "c"}},
		{`sum(a{x="y\"z"}) # a comment naming no_metric` + "\n + 1e-3 * 0x1f", []string{"a"}},
		{`a{x=~"${node:regex}"} * on (instance) group_right b`, []string{"a", "b"}},
		// A metric that shares an aggregation's name is still a metric.
		{`count + 1`, []string{"count"}},
	} {
		got, err := MetricNames(tc.expr)
		if err != nil {
			t.Errorf("MetricNames(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("MetricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestMetricNamesErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`sum(a`, "unclosed ("},
		{`a)`, ") without ("},
		{`a{x="y}`, "unterminated string"},
		{`a{x}`, "no matcher operator"},
		{`a{x=y}`, "must be a quoted string"},
		{`a[5m`, "unterminated ["},
		{`{__name__=~"tether_.*"}`, "only __name__"},
		{`sum by (a b) (x)`, "no label name"},
		{`a ; b`, "unexpected character"},
		{`a}`, "without its opening bracket"},
	} {
		_, err := MetricNames(tc.expr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("MetricNames(%q) err = %v, want it to say %q", tc.expr, err, tc.want)
		}
	}
}

func TestSubstitute(t *testing.T) {
	got := Substitute(`rate(a{node=~"$node", job="${job}"}[$__rate_interval]) + b[$__interval]`)
	want := `rate(a{node=~".*", job=".*"}[5m]) + b[1m]`
	if got != want {
		t.Errorf("Substitute = %q, want %q", got, want)
	}
}

// goodDashboard is a minimal dashboard LoadDashboard accepts; the bad
// cases each break one thing in it.
const goodDashboard = `{
  "uid": "u", "title": "T", "schemaVersion": 39, "editable": true, "graphTooltip": 0, "time": {"from": "now-1h", "to": "now"},
  "timepicker": {}, "fiscalYearStartMonth": 0, "links": [], "annotations": {"list": []},
  "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
  "panels": [
    {"id": 1, "type": "row", "title": "Row", "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0}, "collapsed": false, "panels": []},
    {"id": 2, "type": "timeseries", "title": "A", "gridPos": {"h": 8, "w": 12, "x": 0, "y": 1},
     "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "targets": [{"refId": "A", "expr": "rate(a_total[5m])", "datasource": {"type": "prometheus", "uid": "${datasource}"}}]},
    {"id": 3, "type": "timeseries", "title": "B", "gridPos": {"h": 8, "w": 12, "x": 12, "y": 1},
     "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "targets": [{"refId": "A", "expr": "b", "datasource": {"type": "prometheus", "uid": "${datasource}"}}]}
  ]
}`

func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadDashboard(t *testing.T) {
	d, err := LoadDashboard(writeFile(t, "d.json", goodDashboard))
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, e := range d.Exprs() {
		exprs = append(exprs, e.Expr)
	}
	if want := []string{"rate(a_total[5m])", "b"}; !slices.Equal(exprs, want) {
		t.Errorf("Exprs = %q, want %q", exprs, want)
	}
	for _, tc := range []struct{ old, new, want string }{
		{`"id": 3`, `"id": 2`, "id 2 already used"},
		{`"id": 3, `, ``, "no id"},
		{`"x": 12, "y": 1`, `"x": 6, "y": 1`, "overlaps panel"},
		{`"w": 12, "x": 12`, `"w": 13, "x": 12`, "outside the 24-column grid"},
		{`"expr": "b"`, `"expr": " "`, "no expr"},
		{`"schemaVersion": 39`, `"schemaVersion": 27`, "schemaVersion 27"},
		{`"query": "prometheus"`, `"query": "loki"`, "want prometheus"},
		{`"type": "datasource"`, `"type": "custom"`, "no datasource variable"},
		{`"uid": "${datasource}"}}]}
  ]`, `"uid": "prom1"}}]}
  ]`, "want {type: prometheus, uid: ${datasource}}"},
		{`"targets": [{"refId": "A", "expr": "b",`, `"targets": [], "x": [{"refId": "A", "expr": "b",`, "no targets"},
		{`"panels": []}`, `"panels": [{"id": 9}]}`, "expanded row keeps its panels"},
		{`"schemaVersion": 39,`, `"schemaVersion": 39,,`, "not a JSON dashboard"},
		// Grafana's own schema, through the Foundation SDK.
		{`"uid": "u",`, `"uid": "u", "refreshes": "1m",`, "unexpected field 'refreshes'"},
		{`"refId": "A", "expr": "b"`, `"refId": "A", "expr": "b", "legend": "x"`, "unexpected field 'legend'"},
		{`"h": 8, "w": 12, "x": 12`, `"h": "8", "w": 12, "x": 12`, "gridPos"},
	} {
		if !strings.Contains(goodDashboard, tc.old) {
			t.Fatalf("case %q: goodDashboard lacks %q", tc.want, tc.old)
		}
		_, err := LoadDashboard(writeFile(t, "d.json", strings.Replace(goodDashboard, tc.old, tc.new, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: err = %v, want it to say %q", tc.old, tc.new, err, tc.want)
		}
	}
}

func TestLoadRulesAndTests(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "r.yml")
	os.WriteFile(rules, []byte(`groups:
  - name: g
    rules:
      - alert: A
        expr: a > 0
        for: 5m
        labels: {severity: warning}
        annotations: {summary: s}
      - alert: B
        expr: b > 0
      - record: job:c:rate5m
        expr: rate(c[5m])
`), 0o644)
	rs, err := LoadRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[0].Alert != "A" || rs[2].Record != "job:c:rate5m" {
		t.Fatalf("rules = %+v", rs)
	}
	tests := writeFile(t, "t.yml", `rule_files: [r.yml]
tests:
  - interval: 1m
    input_series:
      - series: 'a{x="1"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 10m
        alertname: A
        exp_alerts:
          - exp_labels: {severity: warning, x: "1"}
      - eval_time: 1m
        alertname: A
        exp_alerts: []
      - eval_time: 1m
        alertname: B
`)
	rt, err := LoadRuleTests(tests)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rt.Series, []string{`a{x="1"}`}) || rt.RuleFiles[0] != filepath.Join(filepath.Dir(tests), "r.yml") {
		t.Errorf("tests = %+v", rt)
	}
	nf, ns := rt.Untested(rs)
	if !slices.Equal(nf, []string{"B"}) || len(ns) != 0 {
		t.Errorf("Untested = %q, %q; want [B], []", nf, ns)
	}

	for _, tc := range []struct{ body, want string }{
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: a\n        fr: 5m\n", "field fr not found"},
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        record: r\n        expr: a\n", "exactly one of alert and record"},
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n", "no expr"},
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: a\n      - alert: A\n        expr: b\n", "defined twice"},
		{"groups: []\n", "no rules"},
	} {
		_, err := LoadRules(writeFile(t, "bad.yml", tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadRules(%q) err = %v, want it to say %q", tc.body, err, tc.want)
		}
	}
}

func TestVariableExprs(t *testing.T) {
	body := strings.Replace(goodDashboard, `{"name": "datasource", "type": "datasource", "query": "prometheus"}`,
		`{"name": "datasource", "type": "datasource", "query": "prometheus"},
		 {"name": "a", "type": "query", "query": "label_values(tether_a{x=\"y\"}, job)"},
		 {"name": "b", "type": "query", "query": {"query": "query_result(sum by (job) (tether_b))", "refId": "B"}},
		 {"name": "c", "type": "query", "query": "label_names()"},
		 {"name": "d", "type": "custom", "query": "x,y"}`, 1)
	d, err := LoadDashboard(writeFile(t, "d.json", body))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range d.VariableExprs() {
		got = append(got, e.Where+": "+e.Expr)
	}
	want := []string{`dashboard variable a: tether_a{x="y"}`, `dashboard variable b: sum by (job) (tether_b)`}
	if !slices.Equal(got, want) {
		t.Errorf("VariableExprs = %q, want %q", got, want)
	}
}
