package strictyaml

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Error is one problem in a file, at the line and column (both 1-based) of
// the offending key or value.
type Error struct {
	File         string
	Line, Column int
	Msg          string
	// Err is the cause when the file could not be read (errors.Is sees it).
	Err error
}

// Unwrap returns the I/O error behind a file that could not be read.
func (e *Error) Unwrap() error { return e.Err }

// Error returns "file:line:col: msg".
func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// ErrorList is every problem found in one or more files, in file order
// and, within a file, in line and column order. A reader of a file format
// returns an ErrorList (never an empty one) when its files are invalid.
type ErrorList []*Error

// Unwrap returns the problems, so that errors.Is and errors.As look at
// each of them.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// Error returns the errors, one per line.
func (l ErrorList) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// SortErrors orders the errors of one file by position (then message) and
// drops exact duplicates (an aliased YAML node walked twice reports its
// problems twice). It sorts errs in place and returns it, shortened.
func SortErrors(errs []*Error) []*Error {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column), cmp.Compare(a.Msg, b.Msg))
	})
	return slices.CompactFunc(errs, func(a, b *Error) bool { return *a == *b })
}
