package config

// SyntaxError turns an error of yaml.v3's decoder on data, the contents of
// the file called name, into an Error at the line (and, for an unknown
// anchor, the column) it names, as config files report theirs: for other
// YAML files that rls reads (rls test's test files).
func SyntaxError(name string, data []byte, err error) *Error {
	p := newParser(name, len(data))
	p.syntaxError(err, data)
	return p.errs[0]
}
