package monitoring

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Rule is one alerting or recording rule of a Prometheus rule file.
type Rule struct {
	Alert  string `yaml:"alert"`
	Record string `yaml:"record"`
	Expr   string `yaml:"expr"`
	// For, KeepFiringFor, Labels and Annotations are read so that an
	// unknown key can be told from a known one; they are not checked here.
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// ruleFile is a Prometheus rule file: groups of rules.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	} `yaml:"groups"`
}

// LoadRules reads a Prometheus rule file and returns its rules. Unknown
// keys are errors (promtool's are too), and so are a rule with neither or
// both of alert and record, or with no expr, and an alert name used twice.
func LoadRules(path string) ([]Rule, error) {
	var f ruleFile
	if err := decodeStrict(path, &f); err != nil {
		return nil, err
	}
	var out []Rule
	var errs []error
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for i, r := range g.Rules {
			switch {
			case (r.Alert == "") == (r.Record == ""):
				errs = append(errs, fmt.Errorf("group %s rule %d: want exactly one of alert and record", g.Name, i))
			case r.Expr == "":
				errs = append(errs, fmt.Errorf("group %s rule %d (%s%s): no expr", g.Name, i, r.Alert, r.Record))
			case r.Alert != "" && seen[r.Alert]:
				errs = append(errs, fmt.Errorf("group %s: alert %s defined twice", g.Name, r.Alert))
			}
			seen[r.Alert] = true
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		errs = append(errs, errors.New("no rules"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// RuleTests is what CheckRuleTests read from a promtool test file.
type RuleTests struct {
	// RuleFiles are the rule files the tests load, relative to the test
	// file's directory as promtool resolves them.
	RuleFiles []string
	// Series are the input series selectors, in file order.
	Series []string
	// Firing maps each alert name to the number of alert_rule_test cases
	// that expect it to fire (a non-empty exp_alerts).
	Firing map[string]int
	// Silent maps each alert name to the number of cases that expect no
	// alert (an empty exp_alerts).
	Silent map[string]int
}

// LoadRuleTests reads a promtool unit test file (promtool test rules).
func LoadRuleTests(path string) (*RuleTests, error) {
	var f struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		GroupEvalOrder     []string `yaml:"group_eval_order"`
		Tests              []struct {
			Name        string `yaml:"name"`
			Interval    string `yaml:"interval"`
			InputSeries []struct {
				Series string `yaml:"series"`
				Values string `yaml:"values"`
			} `yaml:"input_series"`
			AlertRuleTests []struct {
				EvalTime  string `yaml:"eval_time"`
				Alertname string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpLabels      map[string]string `yaml:"exp_labels"`
					ExpAnnotations map[string]string `yaml:"exp_annotations"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
			PromQLExprTests []struct {
				Expr       string `yaml:"expr"`
				EvalTime   string `yaml:"eval_time"`
				ExpSamples []struct {
					Labels string  `yaml:"labels"`
					Value  float64 `yaml:"value"`
				} `yaml:"exp_samples"`
			} `yaml:"promql_expr_test"`
		} `yaml:"tests"`
	}
	if err := decodeStrict(path, &f); err != nil {
		return nil, err
	}
	rt := &RuleTests{Firing: map[string]int{}, Silent: map[string]int{}}
	for _, rf := range f.RuleFiles {
		rt.RuleFiles = append(rt.RuleFiles, filepath.Join(filepath.Dir(path), rf))
	}
	for _, t := range f.Tests {
		for _, s := range t.InputSeries {
			rt.Series = append(rt.Series, s.Series)
		}
		for _, a := range t.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				rt.Firing[a.Alertname]++
			} else {
				rt.Silent[a.Alertname]++
			}
		}
	}
	return rt, nil
}

// Untested returns the alerts of rules that no case of rt expects to fire,
// and those no case expects to stay silent, sorted.
func (rt *RuleTests) Untested(rules []Rule) (neverFiring, neverSilent []string) {
	for _, r := range rules {
		if r.Alert == "" {
			continue
		}
		if rt.Firing[r.Alert] == 0 {
			neverFiring = append(neverFiring, r.Alert)
		}
		if rt.Silent[r.Alert] == 0 {
			neverSilent = append(neverSilent, r.Alert)
		}
	}
	slices.Sort(neverFiring)
	slices.Sort(neverSilent)
	return neverFiring, neverSilent
}

// decodeStrict decodes one YAML document of path into v, refusing unknown
// keys; the error names the file and the line.
func decodeStrict(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
