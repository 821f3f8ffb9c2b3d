package strictyaml

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// yamlErrorLine matches yaml.v3's syntax errors that carry a line.
var yamlErrorLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlAnchor matches yaml.v3's unknown-anchor error, which carries no line.
var yamlAnchor = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)

// syntaxError records an error of yaml.v3's decoder on data. yaml.v3 gives
// a line (or none: then it is line 1) but no column; the column is then 1.
// An unknown anchor is found in data for its place.
func (r *Reader) syntaxError(err error, data []byte) {
	msg := err.Error()
	line, col := 1, 1
	if m := yamlErrorLine.FindStringSubmatch(msg); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil && n > 0 {
			line = n
		}
		msg = m[2]
		// yaml.v3 numbers the lines of scanner errors from 1 but those of
		// parser errors from 0 (the start of the construct being parsed).
		if isParserProblem(msg) {
			line++
		}
	} else if m := yamlAnchor.FindStringSubmatch(msg); m != nil {
		line, col = locate(data, "*"+m[1])
		msg = strings.TrimPrefix(msg, "yaml: ")
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	r.errs = append(r.errs, &Error{File: r.file, Line: line, Column: col, Msg: "invalid YAML: " + msg})
}

// parserProblems are the messages of yaml.v3's parser (parserc.go), as
// opposed to its scanner.
var parserProblems = []string{
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected '-' indicator",
	"did not find expected <document start>",
	"did not find expected <stream-start>",
	"did not find expected key",
	"did not find expected node content",
	"found duplicate %TAG directive",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found undefined tag handle",
}

func isParserProblem(msg string) bool {
	return slices.Contains(parserProblems, msg)
}

// locate returns the 1-based line and column of the first s in data, or 1:1.
func locate(data []byte, s string) (line, col int) {
	i := strings.Index(string(data), s)
	if i < 0 {
		return 1, 1
	}
	before := data[:i]
	line = 1 + strings.Count(string(before), "\n")
	col = i + 1
	if nl := strings.LastIndexByte(string(before), '\n'); nl >= 0 {
		col = i - nl
	}
	return line, col
}
