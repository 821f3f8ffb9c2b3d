package replay

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a replay found; its JSON is rls replay --json's (a
// field's name and form are part of it).
type Report struct {
	// Decisions is the decisions replayed; Changed those whose code
	// differs between the baseline and the candidate (NewlyDenied: OK
	// under the baseline, OVER_LIMIT under the candidate; NewlyAdmitted:
	// the other way).
	Decisions     int `json:"decisions"`
	Changed       int `json:"changed"`
	NewlyDenied   int `json:"newly_denied"`
	NewlyAdmitted int `json:"newly_admitted"`
	// Reproduced is the decisions whose baseline code is the one logged;
	// NotReproduced lists the first that are not.
	Reproduced    int        `json:"reproduced"`
	NotReproduced []Mismatch `json:"not_reproduced,omitempty"`
	// Skipped is the records not replayed: decisions the store failed
	// (nothing was counted), records with no descriptor kept. Resets is
	// the resets replayed. Sampled is the decisions replayed without some
	// of their descriptors (sampled out).
	Skipped   int           `json:"skipped"`
	Resets    int           `json:"resets"`
	Sampled   int           `json:"sampled"`
	From      time.Time     `json:"from"`
	To        time.Time     `json:"to"`
	Baseline  string        `json:"baseline_config"`
	Candidate string        `json:"candidate_config"`
	Notes     []string      `json:"notes,omitempty"`
	Limits    []LimitReport `json:"limits"`
}

// Mismatch is a decision whose replay under the baseline does not give
// the code logged.
type Mismatch struct {
	Line     int       `json:"line"`
	Time     time.Time `json:"time"`
	Logged   string    `json:"logged"`
	Replayed string    `json:"replayed"`
}

// LimitReport is one limit: what each config's limit of that domain and
// name admitted and denied, and the keys whose denials change most.
type LimitReport struct {
	Domain string `json:"domain"`
	Name   string `json:"name"`
	// Descriptor is the limit's config node: key and value per level
	// (value "" for any value).
	Descriptor []Entry `json:"descriptor"`
	Baseline   Counts  `json:"baseline"`
	Candidate  Counts  `json:"candidate"`
	// KeysChanged is the number of keys whose denials differ; ChangedKeys
	// the most changed.
	KeysChanged int         `json:"keys_changed"`
	ChangedKeys []KeyChange `json:"changed_keys,omitempty"`
}

// Counts are a limit's verdicts under one config: requests it admitted
// and denied (its own verdict), and the keys it admitted at least once
// and denied at least once.
type Counts struct {
	Admitted     uint64 `json:"admitted"`
	Denied       uint64 `json:"denied"`
	KeysAdmitted uint64 `json:"keys_admitted"`
	KeysDenied   uint64 `json:"keys_denied"`
}

// KeyChange is a key whose denials differ.
type KeyChange struct {
	Descriptor      []Entry `json:"descriptor"`
	BaselineDenied  uint64  `json:"baseline_denied"`
	CandidateDenied uint64  `json:"candidate_denied"`
	// FirstDenied is the candidate's first denial of the key (nil when it
	// denies none), BaselineFirstDenied the baseline's.
	FirstDenied         *time.Time `json:"first_denied,omitempty"`
	BaselineFirstDenied *time.Time `json:"baseline_first_denied,omitempty"`
}

// Entry is a descriptor entry.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// WriteText writes the report for a terminal.
func (rep *Report) WriteText(w io.Writer) {
	span := ""
	if rep.Decisions > 0 {
		span = fmt.Sprintf(" from %s to %s", rep.From.Format(time.RFC3339Nano), rep.To.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(w, "replayed %d decisions%s", rep.Decisions, span)
	if rep.Resets > 0 {
		fmt.Fprintf(w, ", %d resets", rep.Resets)
	}
	if rep.Skipped > 0 {
		fmt.Fprintf(w, " (%d records skipped: the store had failed, or no key kept)", rep.Skipped)
	}
	fmt.Fprintf(w, "\nbaseline: %s; candidate: %s\n", rep.Baseline, rep.Candidate)
	fmt.Fprintf(w, "the baseline gives the logged code to %d of %d decisions\n", rep.Reproduced, rep.Decisions)
	for _, m := range rep.NotReproduced {
		fmt.Fprintf(w, "  line %d at %s: logged %s, replayed %s\n", m.Line, m.Time.Format(time.RFC3339Nano), m.Logged, m.Replayed)
	}
	fmt.Fprintf(w, "changed: %d decisions (%d OK → OVER_LIMIT, %d OVER_LIMIT → OK)\n", rep.Changed, rep.NewlyDenied, rep.NewlyAdmitted)
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, l := range rep.Limits {
		fmt.Fprintf(w, "\n%s %s (%s)\n", l.Domain, l.Name, pathText(l.Descriptor))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "\trequests admitted\tdenied\tkeys admitted\tdenied\t\n")
		for _, c := range []struct {
			name string
			c    Counts
		}{{"baseline", l.Baseline}, {"candidate", l.Candidate}} {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t\n", c.name, c.c.Admitted, c.c.Denied, c.c.KeysAdmitted, c.c.KeysDenied)
		}
		tw.Flush()
		if l.KeysChanged == 0 {
			continue
		}
		fmt.Fprintf(w, "  %d keys change; the most:\n", l.KeysChanged)
		for _, k := range l.ChangedKeys {
			first := "never denied"
			if k.FirstDenied != nil {
				first = "first denied at " + k.FirstDenied.Format(time.RFC3339Nano)
			}
			fmt.Fprintf(w, "    %s: denied %d → %d, %s\n", entriesText(k.Descriptor), k.BaselineDenied, k.CandidateDenied, first)
		}
	}
}

func pathText(p []Entry) string {
	var parts []string
	for _, e := range p {
		if e.Value == "" {
			parts = append(parts, e.Key)
		} else {
			parts = append(parts, e.Key+"="+e.Value)
		}
	}
	return strings.Join(parts, "/")
}

func entriesText(es []Entry) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, e.Key+"="+e.Value)
	}
	return strings.Join(parts, ",")
}
