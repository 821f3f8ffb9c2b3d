package compat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/config"
)

// FromXDS builds a Config from RateLimitConfig resources received over xDS
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig), one
// domain per resource. Each resource is written as the YAML document it
// stands for and goes through the file loader's parsing and validation, so
// that a config means the same whether it comes from a file or from xDS.
// The proto has a fixed set of fields (no value_to_metric, share_threshold
// or rls extensions), so there is no unknown-key check to skip. opts apply
// as for files (MergeDomains merges resources of one domain). An invalid
// set is an *XDSError naming each problem's resource.
func FromXDS(opts config.ParseOptions, configs []*rlsconfv3.RateLimitConfig) (*config.Config, error) {
	files := make([]config.File, 0, len(configs))
	for i, rc := range configs {
		data, err := yaml.Marshal(xdsDocument(rc))
		if err != nil {
			return nil, fmt.Errorf("RateLimitConfig %q: %w", rc.GetName(), err) // a scalar yaml cannot write: not expected
		}
		files = append(files, config.File{Name: xdsSourceName(i, rc), Data: data})
	}
	cfg, err := config.ParseFiles(opts, files...)
	var list config.ErrorList
	if errors.As(err, &list) {
		return nil, xdsError(list)
	}
	return cfg, err
}

// xdsSourceName names resource i in Domain.File and in errors:
// `RateLimitConfig "name"`, or its position when it has no name.
func xdsSourceName(i int, rc *rlsconfv3.RateLimitConfig) string {
	if rc.GetName() == "" {
		return fmt.Sprintf("RateLimitConfig #%d", i)
	}
	return "RateLimitConfig " + strconv.Quote(rc.GetName())
}

// XDSError lists the problems of a set of RateLimitConfig resources, each
// as "RateLimitConfig "name": message" (the lines and columns of the YAML
// they were written as mean nothing to whoever sent them).
type XDSError struct {
	Problems []string
}

func (e *XDSError) Error() string { return strings.Join(e.Problems, "; ") }

func xdsError(list config.ErrorList) *XDSError {
	e := &XDSError{}
	for _, p := range list {
		e.Problems = append(e.Problems, p.File+": "+p.Msg)
	}
	return e
}

// xdsDocument is rc as the YAML document of a config file.
func xdsDocument(rc *rlsconfv3.RateLimitConfig) *yaml.Node {
	doc := mappingNode()
	addScalar(doc, "domain", rc.GetDomain())
	if ds := rc.GetDescriptors(); len(ds) > 0 {
		addNode(doc, "descriptors", xdsDescriptors(ds))
	}
	return doc
}

func xdsDescriptors(ds []*rlsconfv3.RateLimitDescriptor) *yaml.Node {
	list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for _, d := range ds {
		n := mappingNode()
		addScalar(n, "key", d.GetKey())
		if d.GetValue() != "" {
			addScalar(n, "value", d.GetValue())
		}
		if rl := d.GetRateLimit(); rl != nil {
			addNode(n, "rate_limit", xdsPolicy(rl))
		}
		if d.GetShadowMode() {
			addBool(n, "shadow_mode")
		}
		if d.GetDetailedMetric() {
			addBool(n, "detailed_metric")
		}
		if children := d.GetDescriptors(); len(children) > 0 {
			addNode(n, "descriptors", xdsDescriptors(children))
		}
		list.Content = append(list.Content, n)
	}
	return list
}

// xdsPolicy is a rate_limit. A unit the proto does not name (a newer
// control plane's) is written as its number, which validation refuses.
func xdsPolicy(rl *rlsconfv3.RateLimitPolicy) *yaml.Node {
	n := mappingNode()
	if u := rl.GetUnit(); u != rlsconfv3.RateLimitUnit_UNKNOWN {
		name, ok := rlsconfv3.RateLimitUnit_name[int32(u)]
		if !ok {
			name = strconv.Itoa(int(u))
		}
		addScalar(n, "unit", strings.ToLower(name))
	}
	if !rl.GetUnlimited() {
		addNode(n, "requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(rl.GetRequestsPerUnit()), 10)})
	} else {
		addBool(n, "unlimited")
	}
	if rl.GetName() != "" {
		addScalar(n, "name", rl.GetName())
	}
	if rs := rl.GetReplaces(); len(rs) > 0 {
		list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range rs {
			item := mappingNode()
			addScalar(item, "name", r.GetName())
			list.Content = append(list.Content, item)
		}
		addNode(n, "replaces", list)
	}
	return n
}

func mappingNode() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func addNode(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// addScalar adds a string value, written quoted so that YAML reads it back
// as the same text whatever it holds ("yes", "1e3", "*x", "").
func addScalar(m *yaml.Node, key, value string) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, Style: yaml.DoubleQuotedStyle})
}

func addBool(m *yaml.Node, key string) {
	addNode(m, key, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
}
