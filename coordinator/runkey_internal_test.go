package coordinator

import "testing"

// TestRunSetPartsPerNode: a fan-out id's node runs are one per node; the
// same id on the same node again is taken (a duplicate, refused 409), and
// removing one leaves the others.
func TestRunSetPartsPerNode(t *testing.T) {
	var s runSet
	a, b, whole := &job{}, &job{}, &job{}
	ka, kb := runKeyOf("x", []string{"n1"}, true), runKeyOf("x", []string{"n2"}, true)
	s.add(ka, a)
	if s.get(kb) != nil {
		t.Fatalf("node n2's run of x taken by node n1's")
	}
	s.add(kb, b)
	if s.get(runKeyOf("x", []string{"n1"}, true)) != a {
		t.Errorf("a second run of x on n1 is not refused")
	}
	if s.whole("x") != nil {
		t.Errorf("parts of x count as x run whole")
	}
	s.add(runKeyOf("x", []string{"n1", "n2"}, false), whole)
	if s.len() != 3 || len(s.parts("x", "")) != 2 || len(s.parts("x", "n2")) != 1 || s.parts("x", "n2")[0] != b {
		t.Errorf("len %d, parts %d", s.len(), len(s.parts("x", "")))
	}
	if s.remove(ka, b) || !s.remove(ka, a) || s.get(kb) != b || s.len() != 2 {
		t.Errorf("remove: len %d", s.len())
	}
	s.remove(kb, b)
	s.remove(runKey{id: "x"}, whole)
	if s.len() != 0 || len(s.byID) != 0 {
		t.Errorf("not empty: %d, %v", s.len(), s.byID)
	}
}
