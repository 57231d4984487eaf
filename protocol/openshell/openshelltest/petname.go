package openshelltest

import (
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// Word lists for generated names: lowercase ASCII only, so every name is a
// DNS-1123 label.
var (
	adjectives = []string{"brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lively", "merry",
		"nimble", "proud", "quick", "silly", "swift", "witty", "bold", "bright", "clever", "daring"}
	animals = []string{"otter", "falcon", "badger", "heron", "lynx", "marmot", "panda", "quokka", "raven", "salmon",
		"tiger", "walrus", "yak", "zebra", "gecko", "ibis", "koala", "lemur", "newt", "puffin"}
)

// petnameLocked generates a name for a create without one, as the gateway
// does (wire-facts §1.4): two words joined by '-', cut to 19 characters,
// trailing '-' trimmed; unique in w. After a few collisions it falls back
// to a word and a counter. g.mu is held.
func (g *Gateway) petnameLocked(w *workspace) string {
	for i := 0; ; i++ {
		name := adjectives[rand.IntN(len(adjectives))] + "-" + animals[rand.IntN(len(animals))]
		if i >= 8 {
			name = adjectives[rand.IntN(len(adjectives))] + "-" + strconv.FormatUint(g.seq+uint64(i), 36)
		}
		if len(name) > openshell.MaxNameLen {
			name = name[:openshell.MaxNameLen]
		}
		name = strings.TrimRight(name, "-")
		if w.sandboxes[name] == nil {
			return name
		}
	}
}
