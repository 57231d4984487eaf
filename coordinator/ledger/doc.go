// Package ledger is Tether's sandbox ledger, lease table and reaper.
package ledger
