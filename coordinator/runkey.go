package coordinator

// runKey names one running job on this coordinator: its id and, for one
// node's run of a fan-out that another coordinator runs (forwarded here
// with headerFanoutRun: runRemote), that node. A job this coordinator
// runs whole has node "". A detached fan-out's node runs all have the
// fan-out's id (so that each node's job is the fan-out's), and several of
// them land on the coordinator holding several of its nodes: keyed by id
// alone, all but the first were refused as already running. So an id runs
// once whole and once per node as a part; the same id on the same node
// twice is still refused (and a node's agent refuses a second detached job
// of one id whichever way it came).
type runKey struct {
	id   string
	node string // the part's node; "" for a job run whole
}

// runKeyOf is the key of a job for id on targets: a fan-out's node run
// (fanoutRun: forwarded with headerFanoutRun, so on exactly one node) is
// keyed by its node, any other job by id alone.
func runKeyOf(id string, targets []string, fanoutRun bool) runKey {
	if fanoutRun && len(targets) == 1 {
		return runKey{id: id, node: targets[0]}
	}
	return runKey{id: id}
}

// runSet is the coordinator's running jobs (Coordinator.jobs), by id and
// then by node ("" for a job run whole). The zero value is empty and
// ready; Coordinator.mu guards it.
type runSet struct {
	byID map[string]map[string]*job
	n    int
}

// len is how many jobs run.
func (s *runSet) len() int { return s.n }

// get is the job of k, nil if none runs.
func (s *runSet) get(k runKey) *job { return s.byID[k.id][k.node] }

// add registers j under k, replacing nothing: the caller checked get.
func (s *runSet) add(k runKey, j *job) {
	if s.byID == nil {
		s.byID = map[string]map[string]*job{}
	}
	m := s.byID[k.id]
	if m == nil {
		m = map[string]*job{}
		s.byID[k.id] = m
	}
	if _, ok := m[k.node]; !ok {
		s.n++
	}
	m[k.node] = j
}

// remove unregisters k if j is its job, and reports whether it was.
func (s *runSet) remove(k runKey, j *job) bool {
	m := s.byID[k.id]
	if m[k.node] != j || j == nil {
		return false
	}
	delete(m, k.node)
	if len(m) == 0 {
		delete(s.byID, k.id)
	}
	s.n--
	return true
}

// whole is the job id run whole here, nil if none.
func (s *runSet) whole(id string) *job { return s.byID[id][""] }

// parts are the fan-out node runs of id running here (node "" excluded),
// or only node's when node is not "".
func (s *runSet) parts(id, node string) []*job {
	var out []*job
	for n, j := range s.byID[id] {
		if n != "" && (node == "" || n == node) {
			out = append(out, j)
		}
	}
	return out
}

// all are every running job, in no order.
func (s *runSet) all() []*job {
	out := make([]*job, 0, s.n)
	for _, m := range s.byID {
		for _, j := range m {
			out = append(out, j)
		}
	}
	return out
}
