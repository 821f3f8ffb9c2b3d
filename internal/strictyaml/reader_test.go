package strictyaml

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// read runs walk on each document of text with a reader of opts and
// returns the problems (sorted) as "line:col: msg".
func read(text string, opts Options, walk func(r *Reader, root *yaml.Node)) []string {
	r := NewReader("f.yaml", opts)
	for root := range r.Documents([]byte(text)) {
		walk(r, root)
	}
	var out []string
	for _, e := range SortErrors(r.Errors()) {
		out = append(out, fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg))
	}
	return out
}

func check(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: problems\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestErrorFormat(t *testing.T) {
	e := &Error{File: "limits.yaml", Line: 14, Column: 7, Msg: `unit "fortnight" is not one of second|minute`}
	if got, want := e.Error(), `limits.yaml:14:7: unit "fortnight" is not one of second|minute`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	list := ErrorList{e, {File: "b.yaml", Line: 1, Column: 2, Msg: "x", Err: fs.ErrNotExist}}
	if got, want := list.Error(), e.Error()+"\nb.yaml:1:2: x"; got != want {
		t.Errorf("ErrorList.Error() = %q, want %q", got, want)
	}
	if !errors.Is(list, fs.ErrNotExist) {
		t.Errorf("errors.Is(list, fs.ErrNotExist) = false, want the cause of its second problem")
	}
}

func TestSortErrors(t *testing.T) {
	errs := []*Error{
		{File: "f", Line: 3, Column: 1, Msg: "b"},
		{File: "f", Line: 1, Column: 9, Msg: "a"},
		{File: "f", Line: 3, Column: 1, Msg: "a"},
		{File: "f", Line: 1, Column: 9, Msg: "a"}, // an aliased node walked twice
	}
	var got []string
	for _, e := range SortErrors(errs) {
		got = append(got, e.Error())
	}
	check(t, "SortErrors", got, "f:1:9: a", "f:3:1: a", "f:3:1: b")
}

// TestDocuments: documents in order, empty and null ones skipped, a
// syntax error at the line yaml.v3 means.
func TestDocuments(t *testing.T) {
	var roots []string
	got := read("---\na: 1\n---\n---\n~\n---\nb: 2\n", Options{}, func(r *Reader, root *yaml.Node) {
		roots = append(roots, root.Content[0].Value)
	})
	if len(got) != 0 || strings.Join(roots, ",") != "a,b" {
		t.Errorf("documents %q, problems %q; want a and b, none", roots, got)
	}
	for _, tc := range []struct{ text, want string }{
		{"a: [1, 2\nb: 3\n", "2:1: invalid YAML: did not find expected ',' or ']'"},        // parser: counted from 0
		{"a:\n\tb: 1\n", "2:1: invalid YAML: found character that cannot start any token"}, // scanner: from 1
		{"a: 1\nb: *nope\n", "2:4: invalid YAML: unknown anchor 'nope' referenced"},
	} {
		check(t, tc.text, read(tc.text, Options{}, func(*Reader, *yaml.Node) {}), tc.want)
	}
}

// TestFields: merge keys expand, explicit keys win over merged ones and
// earlier merges over later ones; duplicates are found in small and big
// mappings; keys must be scalars.
func TestFields(t *testing.T) {
	text := "base: &b {x: 1, y: 2}\nother: &o {y: 3, z: 4}\nm: {<<: [*b, *o], x: 9}\n"
	var got string
	problems := read(text, Options{}, func(r *Reader, root *yaml.Node) {
		for _, f := range r.Fields(root) {
			if f.Key != "m" {
				continue
			}
			for _, mf := range r.Fields(r.Resolve(f.Value)) {
				got += mf.Key + "=" + r.Resolve(mf.Value).Value + " "
			}
		}
	})
	if got != "x=9 y=2 z=4 " || len(problems) != 0 {
		t.Errorf("merged fields %q, problems %q; want x=9 y=2 z=4", got, problems)
	}

	var big strings.Builder
	for i := range 40 {
		fmt.Fprintf(&big, "k%d: %d\n", i, i)
	}
	big.WriteString("k7: again\n[a]: 1\n")
	check(t, "duplicates and a list key", read(big.String(), Options{}, func(r *Reader, root *yaml.Node) { r.Fields(root) }),
		`41:1: duplicate key "k7" (first at 8:1)`, "42:1: a mapping key must be a string, got a list")

	check(t, "merge cycle", read("m: &m {<<: *m}\n", Options{}, func(r *Reader, root *yaml.Node) {
		for _, f := range r.Fields(root) {
			r.Fields(r.Resolve(f.Value))
		}
	}), "1:8: a merge key (<<) brings in the mapping that contains it")
	check(t, "merge of a scalar", read("<<: 5\n", Options{}, func(r *Reader, root *yaml.Node) { r.Fields(root) }),
		"1:5: a merge key (<<) takes a mapping or a list of mappings, got number 5")
}

// TestScalars: one rule per type, the problem at the value.
// result is what a typed reader read, as text, and whether it could.
type result struct {
	text string
	ok   bool
}

func TestScalars(t *testing.T) {
	for _, tc := range []struct {
		value string
		read  func(r *Reader, n *yaml.Node) result
		want  result
		err   string
	}{
		{"200", str, result{"200", true}, ""},
		{"'x y'", str, result{"x y", true}, ""},
		{"[a]", str, result{"", false}, "v must be a string, got a list"},
		{"on", boolean, result{"true", true}, ""},
		{"No", boolean, result{"false", true}, ""},
		{"'true'", boolean, result{"false", true}, `v must be true or false, got string "true"`},
		{"1", boolean, result{"false", true}, "v must be true or false, got number 1"},
		{"1_000", number, result{"1000", true}, ""},
		{"0x10", number, result{"16", true}, ""},
		{"0o17", number, result{"15", true}, ""},
		{"017", number, result{"15", true}, ""},
		{"0b101", number, result{"5", true}, ""},
		{"+7", number, result{"7", true}, ""},
		{"4294967295", number, result{"4294967295", true}, ""},
		{"4294967296", number, result{"0", false}, "v 4294967296 is out of range (at most 4294967295)"},
		{"99999999999999999999", number, result{"0", false}, "v 99999999999999999999 is out of range (at most 4294967295)"},
		{"-1", number, result{"0", false}, "v must not be negative, got -1"},
		{"-99999999999999999999", number, result{"0", false}, "v must not be negative, got -99999999999999999999"},
		{"1.5", number, result{"0", false}, "v must be a whole number, got number 1.5"},
		{"'10'", number, result{"0", false}, `v must be a whole number, got string "10"`},
		{"1h30m", duration, result{"1h30m0s", true}, ""},
		{"-1.5s", duration, result{"-1.5s", true}, ""},
		{"0", duration, result{"0s", true}, ""},
		{"10", duration, result{"0s", false}, "v must be a duration (e.g. 1.5s, 2m, 1h30m), got number 10"},
		{"{a: 1}", mapping, result{"a", true}, ""},
		{"[a]", mapping, result{"", false}, "v must be a mapping, got a list"},
		{"[a, b]", list, result{"2", true}, ""},
		{"a", list, result{"0", false}, `v must be a list, got string "a"`},
	} {
		var got result
		problems := read("v: "+tc.value+"\n", Options{}, func(r *Reader, root *yaml.Node) {
			got = tc.read(r, r.Fields(root)[0].Value)
		})
		var want []string
		if tc.err != "" {
			want = []string{"1:4: " + tc.err}
		}
		if got != tc.want {
			t.Errorf("v: %s: read %+v, want %+v", tc.value, got, tc.want)
		}
		check(t, "v: "+tc.value, problems, want...)
	}
}

// The typed readers as the table calls them.
var (
	str     = func(r *Reader, n *yaml.Node) result { s, ok := r.String(n, "v"); return result{s, ok} }
	boolean = func(r *Reader, n *yaml.Node) result { return result{fmt.Sprint(r.Bool(n, "v")), true} }
	number  = func(r *Reader, n *yaml.Node) result {
		x, ok := r.Number(n, "v", math.MaxUint32)
		return result{fmt.Sprint(x), ok}
	}
	duration = func(r *Reader, n *yaml.Node) result { d, ok := r.Duration(n, "v"); return result{d.String(), ok} }
	mapping  = func(r *Reader, n *yaml.Node) result {
		if m := r.Mapping(n, "v"); m != nil {
			return result{m.Content[0].Value, true}
		}
		return result{}
	}
	list = func(r *Reader, n *yaml.Node) result {
		items := r.List(n, "v")
		return result{fmt.Sprint(len(items)), items != nil}
	}
)

// TestNulls: with NullIsZero a null is its type's zero value; without it
// a null is reported, as the type it should have been.
func TestNulls(t *testing.T) {
	text := "s: ~\nb: null\nn:\nd: ~\nm: ~\nl: ~\n"
	walk := func(r *Reader, root *yaml.Node) {
		for _, f := range r.Fields(root) {
			switch f.Key {
			case "s":
				if s, ok := r.String(f.Value, f.Key); s != "" || ok != r.opts.NullIsZero {
					t.Errorf("String(null) = %q, %v", s, ok)
				}
			case "b":
				if r.Bool(f.Value, f.Key) {
					t.Errorf("Bool(null) = true")
				}
			case "n":
				if x, ok := r.Number(f.Value, f.Key, 9); x != 0 || ok != r.opts.NullIsZero {
					t.Errorf("Number(null) = %d, %v", x, ok)
				}
			case "d":
				r.Duration(f.Value, f.Key)
			case "m":
				r.Mapping(f.Value, f.Key)
			case "l":
				r.List(f.Value, f.Key)
			}
		}
	}
	check(t, "NullIsZero", read(text, Options{NullIsZero: true}, walk))
	check(t, "nulls refused", read(text, Options{}, walk),
		"1:4: s must be a string, got null", "2:4: b must be true or false, got null", "3:3: n must be a whole number, got null",
		"4:4: d must be a duration, got null", "5:4: m must be a mapping, got null", "6:4: l must be a list, got null")
}

// TestRefuseAliases: each alias is reported once, at the alias, and
// stands for nothing after: no second problem about what it stood for.
func TestRefuseAliases(t *testing.T) {
	text := "a: &x 5\nb: *x\nc: [*x]\n*x : 1\nd: {e: *x}\n"
	opts := Options{RefuseAliases: "aliases are not supported here"}
	got := read(text, opts, func(r *Reader, root *yaml.Node) {
		for _, f := range r.Fields(root) {
			switch f.Key {
			case "b":
				r.Number(f.Value, f.Key, 9)
			case "c":
				for _, item := range r.List(f.Value, f.Key) {
					r.String(item, "c[0]")
				}
			case "d":
				if fs := r.Object(f.Value, "d", "e"); len(fs) != 0 {
					t.Errorf("Object(d) = %v, want the aliased e left out", fs)
				}
			}
		}
	})
	check(t, "aliases refused", got,
		"2:4: aliases are not supported here", "3:5: aliases are not supported here",
		"4:1: aliases are not supported here",
		"5:8: aliases are not supported here")
}

// TestAliasBounds: aliases that expand past the bounds are reported once,
// at the alias that crosses them, and resolve to nothing after.
func TestAliasBounds(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: &a [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 'b'; i <= 'h'; i++ {
		fmt.Fprintf(&b, "%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	var walk func(r *Reader, n *yaml.Node)
	walk = func(r *Reader, n *yaml.Node) {
		n = r.Resolve(n)
		for _, c := range n.Content {
			walk(r, c)
		}
	}
	got := read(b.String(), Options{}, walk)
	if len(got) != 1 || !strings.Contains(got[0], "aliases expand to more than 100000 nodes") {
		t.Errorf("a billion laughs: %q, want one problem of the node bound", got)
	}

	text := "t: &t " + strings.Repeat("x", 1000) + "\nu: [" + strings.TrimSuffix(strings.Repeat("*t, ", 2000), ", ") + "]\n"
	got = read(text, Options{}, walk)
	want := fmt.Sprintf("aliases expand to more than %d bytes of text (the file's size plus 1 MiB)", len(text)+AliasSlack)
	if len(got) != 1 || !strings.Contains(got[0], want) {
		t.Errorf("a text aliased 2000 times: %q, want one problem: %s", got, want)
	}
}

// TestContext: messages about a named thing say so; ErrorAt does not,
// and warnings are kept apart.
func TestContext(t *testing.T) {
	r := NewReader("f.yaml", Options{})
	n := &yaml.Node{Kind: yaml.ScalarNode, Line: 3, Column: 4}
	r.Errorf(n, "plain")
	outer := r.Context()
	r.SetContext(Context{What: "descriptor", Name: "a/b"})
	r.Errorf(n, "in %s", "context")
	r.ErrorAt(n, "a bound of the file")
	r.Warnf(n, "tolerated")
	r.SetContext(outer)
	r.Errorf(n, "plain again")
	var got []string
	for _, e := range r.Errors() {
		got = append(got, e.Error())
	}
	check(t, "Errors", got, "f.yaml:3:4: plain", `f.yaml:3:4: descriptor "a/b": in context`, "f.yaml:3:4: a bound of the file", "f.yaml:3:4: plain again")
	if w := r.Warnings(); len(w) != 1 || w[0].Error() != `f.yaml:3:4: descriptor "a/b": tolerated` {
		t.Errorf("Warnings = %v", w)
	}
}

// TestObject: the values of the keys asked for, the nearest key proposed
// for a typo, or every key listed.
func TestObject(t *testing.T) {
	var fs map[string]*yaml.Node
	got := read("expct: OK\nrepeat: 2\nzzz: 1\n", Options{}, func(r *Reader, root *yaml.Node) {
		fs = r.Object(root, "a step", "expect", "repeat")
	})
	check(t, "Object", got, `1:1: unknown key "expct" in a step (did you mean "expect"?)`, `3:1: unknown key "zzz" in a step (allowed: expect, repeat)`)
	if len(fs) != 1 || fs["repeat"].Value != "2" {
		t.Errorf("Object = %v, want repeat only", fs)
	}
	check(t, "Object of a list", read("[1]\n", Options{}, func(r *Reader, root *yaml.Node) { r.Object(root, "the file") }),
		"1:1: the file must be a mapping, got a list")
}

func TestDescribe(t *testing.T) {
	for text, want := range map[string]string{
		"{a: 1}": "a mapping", "[1]": "a list", "~": "null", "true": "boolean true", "yes": `string "yes"`, "0x1f": "number 0x1f",
		"1.5": "number 1.5", "abc": `string "abc"`, "'1'": `string "1"`,
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("v: "+text), &doc); err != nil {
			t.Fatal(err)
		}
		if got := Describe(doc.Content[0].Content[1]); got != want {
			t.Errorf("Describe(%s) = %q, want %q", text, got, want)
		}
	}
	if got := Describe(&yaml.Node{Kind: yaml.AliasNode}); got != "an alias" {
		t.Errorf("Describe(alias) = %q", got)
	}
}

// FuzzReader: reading any file never panics, and every problem has a
// place in it.
func FuzzReader(f *testing.F) {
	f.Add([]byte("a: &a {b: [1, 2], c: *a}\n<<: *a\n"))
	f.Add([]byte("a: [1, 2\n"))
	f.Add([]byte("---\nx: y\n---\n~\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, opts := range []Options{{}, {NullIsZero: true, RefuseAliases: "no aliases"}} {
			r := NewReader("f.yaml", opts)
			var walk func(n *yaml.Node, depth int)
			walk = func(n *yaml.Node, depth int) {
				if depth > 64 {
					return
				}
				n = r.Resolve(n)
				switch n.Kind {
				case yaml.MappingNode:
					for _, fl := range r.Fields(n) {
						r.String(fl.Value, fl.Key)
						r.Bool(fl.Value, fl.Key)
						r.Number(fl.Value, fl.Key, math.MaxUint64)
						r.Duration(fl.Value, fl.Key)
						walk(fl.Value, depth+1)
					}
				case yaml.SequenceNode:
					for _, item := range r.List(n, "list") {
						walk(item, depth+1)
					}
				}
			}
			for root := range r.Documents(data) {
				walk(root, 0)
			}
			for _, e := range r.Errors() {
				if e.File != "f.yaml" || e.Line < 1 || e.Column < 1 {
					t.Fatalf("badly placed problem %+v", e)
				}
			}
		}
	})
}
