// Package strictyaml reads YAML files strictly, for the file formats of rls
// (config files, rls test's test files): every problem is collected with
// its file:line:col, mappings are read with their merge keys and without
// duplicate keys, scalars are read as typed values with one rule per type
// (the config's whole numbers, YAML 1.1 booleans, Go durations), and
// aliases are bounded so that a small file cannot stand for a huge one.
// It knows nothing of what a format's keys mean.
package strictyaml
