package config

import "github.com/rlsproject/rls/internal/strictyaml"

// Error is one problem in a config file, at the line and column (both
// 1-based) of the offending key or value: a strictyaml.Error, as every
// file format of rls reports its problems.
type Error = strictyaml.Error

// ErrorList is every problem found while loading a config, in file order
// and, within a file, in line and column order. Parse and Load return an
// ErrorList (never an empty one) when the config is invalid.
type ErrorList = strictyaml.ErrorList
