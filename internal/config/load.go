package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Default caps on the config files of one load. The per-file cap is above
// a flat file of 100,000 descriptors (about 8 MB in flow style) and bounds
// what one file costs to parse (yaml.v3 holds the whole document as nodes:
// about 25 times the file's size, transiently). The total cap leaves room
// for several such files.
const (
	DefaultMaxFileBytes  = 8 << 20
	DefaultMaxTotalBytes = 64 << 20
)

// LoadOptions bound what LoadWith reads. The zero value means the
// defaults; a field at 0 or below takes its default.
type LoadOptions struct {
	// MaxFileBytes is the largest config file read. A bigger one is an
	// error, found without reading past the cap (a pipe or a device that
	// never ends included).
	MaxFileBytes int64
	// MaxTotalBytes bounds the files of one load together.
	MaxTotalBytes int64
	// Parse relaxes the grammar's rules (ParseOptions); the zero value is
	// rls's own.
	Parse ParseOptions
}

// WithDefaults returns o with its unset fields at their defaults.
func (o LoadOptions) WithDefaults() LoadOptions {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	if o.MaxTotalBytes <= 0 {
		o.MaxTotalBytes = DefaultMaxTotalBytes
	}
	return o
}

// Load is LoadWith with the default LoadOptions.
func Load(paths ...string) (*Config, error) {
	return LoadWith(LoadOptions{}, paths...)
}

// LoadWith reads and parses the config files at paths (see ListConfig for
// what a directory stands for). All domains of all files form one Config;
// a domain defined twice is an error. A file named twice (also through its
// directory, or through a symlink) is read once. No path, or only empty
// directories, gives an empty Config. A test file of rls test found in a
// directory is skipped (Config.Skipped); named itself, it is a problem.
// Every problem, a path that cannot be
// read or a file over a cap of opts included, is returned in one ErrorList;
// once the files read reach MaxTotalBytes, the rest are not read.
func LoadWith(opts LoadOptions, paths ...string) (*Config, error) {
	opts = opts.WithDefaults()
	var srcs []source
	seen := make(map[string]bool)
	for _, path := range paths {
		files, dirs, unreadable := ListConfig(path)
		for _, err := range unreadable {
			name := path
			var pe *fs.PathError
			if errors.As(err, &pe) {
				name = pe.Path
			}
			srcs = append(srcs, source{name: name, err: err})
		}
		for _, f := range files {
			if id := realPath(f); !seen[id] {
				seen[id] = true
				srcs = append(srcs, source{name: f, inDir: len(dirs) > 0})
			}
		}
	}
	left := opts.MaxTotalBytes
	full := false // the total cap is reached: the files after are not read
	kept := srcs[:0]
	for _, src := range srcs {
		if src.err == nil {
			if full {
				continue
			}
			limit := min(opts.MaxFileBytes, left)
			var over bool
			src.data, over, src.err = readCapped(src.name, limit)
			switch {
			case over && limit == opts.MaxFileBytes:
				src.err = &capError{fmt.Sprintf("file is larger than the cap of %s on one config file", bytesText(limit))}
			case over:
				src.err = &capError{fmt.Sprintf("config files together are larger than the cap of %s on all files", bytesText(opts.MaxTotalBytes))}
			}
			left -= int64(len(src.data))
			full = over
		}
		kept = append(kept, src)
	}
	return build(kept, opts.Parse)
}

// readCapped reads the file called name, or finds that it holds more than
// limit bytes (over) without reading more than limit+1: a regular file's
// size says so at once; a pipe or a device, whose size says nothing, is
// read up to the cap.
func readCapped(name string, limit int64) (data []byte, over bool, err error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	var size int64
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		if st.Size() > limit {
			return nil, true, nil
		}
		size = st.Size()
	}
	data = make([]byte, 0, size+1) // +1: the read that finds the end
	r := io.LimitReader(f, limit+1)
	for {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := r.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, false, err
		}
	}
	if int64(len(data)) > limit {
		return nil, true, nil
	}
	return data, false, nil
}

// capError is a file over a cap of LoadOptions.
type capError struct{ msg string }

func (e *capError) Error() string { return e.msg }

// bytesText writes a size in bytes, with its MiB when whole: "8 MiB
// (8388608 bytes)".
func bytesText(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB (%d bytes)", n>>20, n)
	}
	return fmt.Sprintf("%d bytes", n)
}

// realPath is p with symlinks resolved and made absolute: one name per
// file or directory, whatever way it was reached.
func realPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	if a, err := filepath.Abs(p); err == nil {
		p = a
	}
	return p
}

// readDir is os.ReadDir; tests make it fail (root reads any directory).
var readDir = os.ReadDir

// ListConfig returns what a config path stands for: the file itself, or
// every *.yaml and *.yml file (in any case) in the directory and, as
// envoyproxy/ratelimit's loader does, in its subdirectories, in name order
// at each level. Names starting with "." are skipped (Kubernetes ConfigMap
// volumes keep their real files in ..data, behind symlinks at the top);
// symlinks are followed, and a directory reached twice (a symlink loop, a
// link to a sibling) is read once. dirs are the directories read, to
// watch. unreadable holds the YAML files that cannot be read, and path
// itself when it cannot be; a subdirectory that cannot be read (a
// lost+found owned by root) is passed over.
func ListConfig(path string) (files, dirs []string, unreadable []error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, []error{err}
	}
	if !st.IsDir() {
		return []string{path}, nil, nil
	}
	visited := make(map[string]bool)
	var walk func(dir string)
	walk = func(dir string) {
		id := realPath(dir)
		if visited[id] {
			return
		}
		visited[id] = true
		entries, err := readDir(dir) // sorted by name
		if err != nil {
			if dir == path {
				unreadable = append(unreadable, err)
			}
			return
		}
		dirs = append(dirs, dir)
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			full := filepath.Join(dir, name)
			// Stat, not e.Type: symlinks count as what they point to.
			st, err := os.Stat(full)
			switch {
			case err != nil:
				if isYAML(name) {
					unreadable = append(unreadable, err)
				}
			case st.IsDir():
				walk(full)
			case st.Mode().IsRegular() && isYAML(name):
				files = append(files, full)
			}
		}
	}
	walk(path)
	return files, dirs, unreadable
}

func isYAML(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}

// source is one config file's name and contents, or why it could not be
// read. inDir says that it was found in a directory rather than named.
type source struct {
	name  string
	data  []byte
	err   error
	inDir bool
}
