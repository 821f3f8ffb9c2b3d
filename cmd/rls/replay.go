package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionlog"
	"github.com/rlsproject/rls/internal/replay"
)

// replayFailed is rls replay's exit status when a config or a log cannot
// be read (1 says that more decisions changed than --max-changed allows).
const replayFailed = 3

func replayDetails(w io.Writer) {
	fmt.Fprint(w, `Replays decision logs (rls serve --decision-log) on a virtual clock against the candidate config
and a baseline, each on a memory store of its own, as rls test runs cases: every decision
again at its instant, with its descriptors and hits. Prints, per limit, the requests and keys
each config admits and denies, the keys whose denials change most with the first instant the
candidate denies each, and how many decisions change. The baseline is --baseline, else the
config each record names (the files its log's header lists, when they still hold that
version), else the candidate itself; under the config that wrote it, a whole log changes 0
decisions and the baseline gives every logged code again. A log sampled by key
(--decision-log-sample) replays its kept keys exactly; the verdicts of the keys sampled out are
taken as logged. Exit status: 0, 1 when more decisions change than --max-changed, 3 when a
config or a log cannot be read, 2 for a bad command line.

  rls replay --config limits-new.yaml /var/log/rls/decisions.log
  rls replay --config limits-new.yaml --max-changed 0 --json decisions.log.1 decisions.log

flags:
`)
	fs, _ := newReplayFlagSet()
	printFlags(w, fs, nil, false)
}

// replayFlags are rls replay's flags.
type replayFlags struct {
	candidate, baseline string
	json                bool
	maxChanged          int
	keys                int
	sizes               configSizes
}

func newReplayFlagSet() (*flag.FlagSet, *replayFlags) {
	fs := flag.NewFlagSet("rls replay", flag.ContinueOnError)
	f := &replayFlags{}
	fs.StringVar(&f.candidate, "config", "", "the candidate config: a YAML `path` (file or directory), as rls serve --config takes it")
	fs.StringVar(&f.baseline, "baseline", "", "the baseline config `path` (default: the config each record names, else the candidate)")
	fs.BoolVar(&f.json, "json", false, `print the report as JSON: {"decisions", "changed", "limits": [{"domain", "name", "descriptor", "baseline", "candidate"}...]...}`)
	fs.IntVar(&f.maxChanged, "max-changed", -1, "exit 1 when more than `N` decisions change (-1: never)")
	fs.IntVar(&f.keys, "keys", 10, "changed `keys` listed per limit")
	f.sizes.define(fs)
	return fs, f
}

// replayCommand runs rls replay.
func replayCommand(args []string, stdout io.Writer) error {
	fs, f := newReplayFlagSet()
	if err := commandFlags("replay", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	if f.candidate == "" || fs.NArg() == 0 {
		return usageError{errors.New("usage: rls replay --config CANDIDATE [--baseline CONFIG] LOG... (rls replay --help)")}
	}
	if f.keys < 1 {
		return usageError{fmt.Errorf("replay: --keys %d: at least 1", f.keys)}
	}
	limits, name, err := f.sizes.parse()
	if err != nil {
		return usageError{fmt.Errorf("replay: --%s: %w", name, err)}
	}
	loadConfig := func(what string, paths ...string) (*config.Config, error) {
		cfg, err := config.LoadWith(limits, paths...)
		if err != nil {
			printProblems(stdout, err)
			return nil, exitError{replayFailed, fmt.Errorf("replay: %s does not load", what)}
		}
		return cfg, nil
	}
	opts := replay.Options{CandidateName: f.candidate, Keys: f.keys,
		Load: func(files []string) (*config.Config, error) { return config.LoadWith(limits, files...) }}
	if opts.Candidate, err = loadConfig("the candidate config "+f.candidate, f.candidate); err != nil {
		return err
	}
	if f.baseline != "" {
		opts.BaselineName = f.baseline
		if opts.Baseline, err = loadConfig("the baseline config "+f.baseline, f.baseline); err != nil {
			return err
		}
	}
	var logs [][]*decisionlog.Record
	for _, path := range fs.Args() {
		recs, err := readLog(path)
		if err != nil {
			return exitError{replayFailed, fmt.Errorf("replay: %w", err)}
		}
		logs = append(logs, recs)
	}
	rep, err := replay.Run(logs, opts)
	if err != nil {
		return exitError{replayFailed, fmt.Errorf("replay: %w", err)}
	}
	if f.json {
		out, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		stdout.Write(append(out, '\n'))
	} else {
		rep.WriteText(stdout)
	}
	if f.maxChanged >= 0 && rep.Changed > f.maxChanged {
		return exitError{1, fmt.Errorf("replay: %d decisions change, more than --max-changed %d", rep.Changed, f.maxChanged)}
	}
	return nil
}

// readLog reads the records of the log at path ("-": stdin is not read).
func readLog(path string) ([]*decisionlog.Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []*decisionlog.Record
	err = decisionlog.Read(f, path, func(r *decisionlog.Record) error {
		recs = append(recs, r)
		return nil
	})
	return recs, err
}
