package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/ucp"
)

// infoReport is what `ucpx info` prints; --json writes it as is.
type infoReport struct {
	UCXVersion string `json:"ucx_version"`
	// Transports are the transport/device pairs UCX sees, from `ucx_info -d`.
	Transports       []transportInfo `json:"transports"`
	TransportsSource string          `json:"transports_source"`
	// MemoryTypes are the memory types a default context communicates from directly.
	MemoryTypes []string   `json:"memory_types"`
	CUDA        cudaStatus `json:"cuda"`
	Errors      []string   `json:"errors,omitempty"`
}

type transportInfo struct {
	Transport     string `json:"transport"`
	Device        string `json:"device"`
	Type          string `json:"type,omitempty"`
	ErrorHandling string `json:"error_handling,omitempty"`
}

type cudaStatus struct {
	Driver        bool   `json:"driver"`
	DriverVersion string `json:"driver_version,omitempty"`
	Devices       int    `json:"devices"`
	Reason        string `json:"reason,omitempty"`
}

func runInfo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("info", "[--json]", stderr)
	asJSON := fs.Bool("json", false, "print machine-readable JSON")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	rep := gatherInfo()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "ucpx info: %v\n", err)
			return 1
		}
	} else {
		printInfo(stdout, rep)
	}
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

func gatherInfo() infoReport {
	var rep infoReport
	maj, min, rel := ucx.Version()
	rep.UCXVersion = fmt.Sprintf("%d.%d.%d", maj, min, rel)

	tls, src, err := ucxInfoTransports()
	rep.Transports, rep.TransportsSource = tls, src
	if err != nil {
		rep.Transports, rep.TransportsSource = []transportInfo{}, "unknown: "+err.Error()
	}

	rep.MemoryTypes = []string{}
	ctx, err := ucp.NewContext(ucp.ContextParams{})
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Sprintf("create UCX context: %v", err))
	} else {
		for _, m := range ctx.MemoryTypes() {
			rep.MemoryTypes = append(rep.MemoryTypes, m.String())
		}
		_ = ctx.Close()
	}

	rep.CUDA = probeCUDA()
	return rep
}

// ucxInfoTransports lists the transport/device pairs from `ucx_info -d`: the UCP API
// has no query for them, and ucx_info prints exactly what UCX's components report.
func ucxInfoTransports() ([]transportInfo, string, error) {
	path, err := exec.LookPath("ucx_info")
	if err != nil {
		return nil, "", errors.New("ucx_info not found in PATH (install ucx-utils)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-d").Output()
	if err != nil {
		return nil, "", fmt.Errorf("%s -d: %w", path, err)
	}
	return parseUCXInfo(out), path + " -d", nil
}

// parseUCXInfo extracts "Transport:", "Device:", "Type:" and "error handling:" lines
// of `ucx_info -d` output into one entry per transport/device pair.
func parseUCXInfo(out []byte) []transportInfo {
	list := []transportInfo{}
	var cur *transportInfo
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "#"))
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch strings.TrimSpace(key) {
		case "Transport":
			list = append(list, transportInfo{Transport: val})
			cur = &list[len(list)-1]
		case "Device":
			if cur != nil && cur.Device == "" {
				cur.Device = val
			}
		case "Type":
			if cur != nil && cur.Type == "" {
				cur.Type = val
			}
		case "error handling":
			if cur != nil && cur.ErrorHandling == "" {
				cur.ErrorHandling = val
			}
		case "Memory domain", "Connection manager":
			cur = nil
		}
	}
	return list
}

func printInfo(w io.Writer, rep infoReport) {
	fmt.Fprintf(w, "UCX version:   %s\n", rep.UCXVersion)
	fmt.Fprintf(w, "Transports:    (source: %s)\n", rep.TransportsSource)
	if len(rep.Transports) == 0 {
		fmt.Fprintf(w, "  none listed\n")
	}
	for _, t := range rep.Transports {
		fmt.Fprintf(w, "  %-8s %-10s %-11s error handling: %s\n", t.Transport, t.Device, t.Type, t.ErrorHandling)
	}
	mt := strings.Join(rep.MemoryTypes, ", ")
	if mt == "" {
		mt = "unknown"
	}
	fmt.Fprintf(w, "Memory types:  %s\n", mt)
	if rep.CUDA.Driver {
		fmt.Fprintf(w, "CUDA driver:   yes (version %s, %d device(s))", rep.CUDA.DriverVersion, rep.CUDA.Devices)
		if rep.CUDA.Reason != "" {
			fmt.Fprintf(w, " — %s", rep.CUDA.Reason)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "CUDA driver:   no (%s)\n", rep.CUDA.Reason)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}
