package overrides

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// Bounds on one override, as on a request's descriptor: what an admin
// client sends cannot make the server hold unbounded memory per override.
const (
	MaxEntries  = config.MaxDepth
	MaxKeyLen   = 256
	MaxValueLen = 4096
	MaxNameLen  = 256
	MaxReason   = 1024
	// MaxTTL is the longest ttl.
	MaxTTL = engine.MaxWindow
)

// Key names an override: a domain, a request descriptor's entries (a
// value ending in '*' covers every value with that prefix; "*" alone every
// value) and the name of one limit ("" for every limit of the node). Two
// overrides with the same key are one: the second replaces the first.
type Key struct {
	Domain     string
	Descriptor []engine.Entry
	Name       string
}

// ID is the key's identity: where a backend keeps the override.
func (k Key) ID() string { return engine.OverrideField(k.Domain, k.Descriptor, k.Name) }

// String is the key as logs and the command line write it:
// "api tenant=acme-* (daily)".
func (k Key) String() string {
	var b strings.Builder
	b.WriteString(k.Domain)
	for _, e := range k.Descriptor {
		b.WriteString(" " + e.Key + "=" + e.Value)
	}
	if k.Name != "" {
		b.WriteString(" (" + k.Name + ")")
	}
	return b.String()
}

// Change is what a client asks to set (PUT /admin/overrides).
type Change struct {
	Key
	RequestsPerUnit uint32
	// Burst is the token buckets' new burst; when not given, as in the
	// config's grammar, RequestsPerUnit.
	Burst engine.Opt[uint32]
	// TTL, when not 0, makes the override expire that long after it is
	// set, by the store's clock.
	TTL    time.Duration
	Reason string
}

// Override is a stored override: its key, its values, when it expires
// (zero: never), why, and when and by whom it was last set. A value:
// never modified once made.
type Override struct {
	Key
	RequestsPerUnit uint32
	Burst           engine.Opt[uint32]
	ExpiresAt       time.Time
	Reason          string
	UpdatedAt       time.Time
	UpdatedBy       string
}

// FieldError is a bad field of a body: Field names it as the JSON writes
// it ("descriptor[1].value").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldError(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// EntryJSON is a descriptor entry in JSON.
type EntryJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// JSON is an override as the API writes it and a backend stores it.
type JSON struct {
	Domain          string      `json:"domain"`
	Descriptor      []EntryJSON `json:"descriptor"`
	Name            string      `json:"name,omitempty"`
	RequestsPerUnit uint32      `json:"requests_per_unit"`
	Burst           *uint32     `json:"burst,omitempty"`
	ExpiresAt       *time.Time  `json:"expires_at,omitempty"`
	Reason          string      `json:"reason,omitempty"`
	UpdatedAt       time.Time   `json:"updated_at"`
	UpdatedBy       string      `json:"updated_by,omitempty"`
}

// Listed is an override as GET /admin/overrides lists it: with what the
// loaded config makes of it. An inactive override matches no limit of the
// loaded config (a reload took its limits away): it is kept, and applies
// again when they come back.
type Listed struct {
	JSON
	Active bool `json:"active"`
	// Limits are the labels of the limits it applies to in the loaded
	// config.
	Limits []string `json:"limits"`
	// Problems say why it does not apply to some limit it matches (its
	// values do not fit that limit's algorithm since a reload).
	Problems []string `json:"problems,omitempty"`
}

// ToJSON returns o as the API writes it.
func (o *Override) ToJSON() JSON {
	j := JSON{Domain: o.Domain, Descriptor: entriesJSON(o.Descriptor), Name: o.Name, RequestsPerUnit: o.RequestsPerUnit,
		Reason: o.Reason, UpdatedAt: o.UpdatedAt.UTC(), UpdatedBy: o.UpdatedBy}
	if o.Burst.Set {
		b := o.Burst.V
		j.Burst = &b
	}
	if !o.ExpiresAt.IsZero() {
		e := o.ExpiresAt.UTC()
		j.ExpiresAt = &e
	}
	return j
}

func entriesJSON(entries []engine.Entry) []EntryJSON {
	out := make([]EntryJSON, len(entries))
	for i, e := range entries {
		out[i] = EntryJSON(e)
	}
	return out
}

// encode is o as a backend stores it.
func encode(o *Override) []byte {
	b, err := json.Marshal(o.ToJSON())
	if err != nil {
		panic(err) // strings, numbers and instants always encode
	}
	return b
}

// decode reads a stored override, checked as a change is.
func decode(rec []byte) (*Override, error) {
	var j JSON
	dec := json.NewDecoder(bytes.NewReader(rec))
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("a stored override is not JSON: %w", err)
	}
	o := &Override{Key: Key{Domain: j.Domain, Name: j.Name}, RequestsPerUnit: j.RequestsPerUnit, Reason: j.Reason, UpdatedAt: j.UpdatedAt, UpdatedBy: j.UpdatedBy}
	for _, e := range j.Descriptor {
		o.Descriptor = append(o.Descriptor, engine.Entry(e))
	}
	if j.Burst != nil {
		o.Burst = engine.Some(*j.Burst)
	}
	if j.ExpiresAt != nil {
		o.ExpiresAt = *j.ExpiresAt
	}
	if err := o.Key.check(); err != nil {
		return nil, fmt.Errorf("a stored override: %w", err)
	}
	return o, nil
}

// changeJSON is the body of PUT /admin/overrides.
type changeJSON struct {
	Domain          *string      `json:"domain"`
	Descriptor      *[]EntryJSON `json:"descriptor"`
	Name            *string      `json:"name"`
	RequestsPerUnit *uint32      `json:"requests_per_unit"`
	Burst           *uint32      `json:"burst"`
	TTL             *string      `json:"ttl"`
	Reason          *string      `json:"reason"`
}

// ParseChange reads the body of PUT /admin/overrides: a JSON object with
// domain, descriptor and requests_per_unit, optionally name, burst, ttl (a
// Go duration) and reason, and nothing else. A problem is a *FieldError
// naming its field.
func ParseChange(body []byte) (Change, error) {
	var j changeJSON
	if err := strictDecode(body, &j); err != nil {
		return Change{}, err
	}
	var c Change
	var err error
	if c.Key, err = keyOf(j.Domain, j.Descriptor, j.Name); err != nil {
		return Change{}, err
	}
	if j.RequestsPerUnit == nil {
		return Change{}, fieldError("requests_per_unit", "is required (0 blocks every request)")
	}
	c.RequestsPerUnit = *j.RequestsPerUnit
	if j.Burst != nil {
		c.Burst = engine.Some(*j.Burst)
	}
	if j.TTL != nil {
		if c.TTL, err = ParseTTL(*j.TTL); err != nil {
			return Change{}, err
		}
	}
	if j.Reason != nil {
		if c.Reason = *j.Reason; len(c.Reason) > MaxReason {
			return Change{}, fieldError("reason", "longer than %d bytes", MaxReason)
		}
	}
	return c, nil
}

// ParseTTL reads a ttl: a Go duration, positive, at most MaxTTL.
func ParseTTL(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fieldError("ttl", "%q is not a duration (such as 2h or 90m)", s)
	case d <= 0:
		return 0, fieldError("ttl", "%s is not positive (leave ttl out for an override that does not expire)", s)
	case d > MaxTTL:
		return 0, fieldError("ttl", "%s is longer than 100 years", s)
	}
	return d, nil
}

// keyJSON is the body of DELETE /admin/overrides.
type keyJSON struct {
	Domain     *string      `json:"domain"`
	Descriptor *[]EntryJSON `json:"descriptor"`
	Name       *string      `json:"name"`
}

// ParseKey reads the body of DELETE /admin/overrides: domain, descriptor
// and optionally name, as the override was set.
func ParseKey(body []byte) (Key, error) {
	var j keyJSON
	if err := strictDecode(body, &j); err != nil {
		return Key{}, err
	}
	return keyOf(j.Domain, j.Descriptor, j.Name)
}

// strictDecode decodes one JSON object into v, refusing unknown fields
// and trailing data; a problem names the field where it can.
func strictDecode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			return fieldError(te.Field, "want %s, got a JSON %s", te.Type, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return fieldError(field, "unknown field (an override has domain, descriptor, name, requests_per_unit, burst, ttl and reason)")
		case errors.Is(err, io.EOF):
			return fieldError("body", "empty (want a JSON object)")
		}
		return fieldError("body", "not a JSON object: %v", err)
	}
	if dec.More() {
		return fieldError("body", "more than one JSON value")
	}
	return nil
}

// keyOf checks and builds a key from the fields of a body.
func keyOf(domain *string, descriptor *[]EntryJSON, name *string) (Key, error) {
	var k Key
	if domain == nil {
		return Key{}, fieldError("domain", "is required")
	}
	k.Domain = *domain
	if descriptor == nil {
		return Key{}, fieldError("descriptor", "is required (a list of {\"key\": K, \"value\": V})")
	}
	for _, e := range *descriptor {
		k.Descriptor = append(k.Descriptor, engine.Entry(e))
	}
	if name != nil {
		k.Name = *name
	}
	return k, k.check()
}

// check checks a key's fields against the bounds and the prefix rule.
func (k Key) check() error {
	switch {
	case k.Domain == "":
		return fieldError("domain", "must not be empty")
	case len(k.Domain) > 256:
		return fieldError("domain", "longer than 256 bytes")
	case len(k.Descriptor) == 0:
		return fieldError("descriptor", "must not be empty")
	case len(k.Descriptor) > MaxEntries:
		return fieldError("descriptor", "%d entries, at most %d", len(k.Descriptor), MaxEntries)
	case len(k.Name) > MaxNameLen:
		return fieldError("name", "longer than %d bytes", MaxNameLen)
	}
	for i, e := range k.Descriptor {
		at := fmt.Sprintf("descriptor[%d]", i)
		switch {
		case e.Key == "":
			return fieldError(at+".key", "must not be empty")
		case len(e.Key) > MaxKeyLen:
			return fieldError(at+".key", "longer than %d bytes", MaxKeyLen)
		case len(e.Value) > MaxValueLen:
			return fieldError(at+".value", "longer than %d bytes", MaxValueLen)
		case strings.Contains(strings.TrimSuffix(e.Value, "*"), "*"):
			return fieldError(at+".value", "%q: '*' may only end a value (a prefix: \"acme-*\"; \"*\" for every value)", e.Value)
		}
	}
	return nil
}

// isPrefix reports whether v is a prefix pattern, and its prefix.
func isPrefix(v string) (string, bool) { return strings.CutSuffix(v, "*") }
