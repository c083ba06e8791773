// Command operator-bundle-validator runs the Operator Framework's own bundle validators
// (github.com/operator-framework/api/pkg/validation, the library behind `operator-sdk bundle validate`) on a bundle
// directory and prints the results as JSON: one object per manifest with its errors and warnings. It exits 1 when any
// validator reports an error, 2 when the bundle cannot be read.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

type finding struct {
	Type    string `json:"type"`
	Level   string `json:"level"`
	Field   string `json:"field,omitempty"`
	Detail  string `json:"detail"`
	Message string `json:"message"`
}

type result struct {
	Name     string    `json:"name"`
	Errors   []finding `json:"errors"`
	Warnings []finding `json:"warnings"`
}

func convert(in []errors.Error) []finding {
	out := []finding{}
	for _, e := range in {
		out = append(out, finding{Type: string(e.Type), Level: string(e.Level), Field: e.Field, Detail: e.Detail,
			Message: e.Error()})
	}
	return out
}

func main() {
	k8sVersion := flag.String("k8s-version", "", "Kubernetes version for the deprecated-API check, e.g. 1.34")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: operator-bundle-validator [--k8s-version X.Y] BUNDLE_DIR")
		os.Exit(2)
	}
	bundle, err := manifests.GetBundleFromDir(flag.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot read bundle: %v\n", err)
		os.Exit(2)
	}
	objs := bundle.ObjectsToValidate()
	objs = append(objs, map[string]string{"k8s-version": *k8sVersion})
	validators := append(validation.DefaultBundleValidators,
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
	)
	failed := false
	out := []result{}
	for _, r := range validators.Validate(objs...) {
		if len(r.Errors) == 0 && len(r.Warnings) == 0 {
			continue
		}
		failed = failed || len(r.Errors) > 0
		out = append(out, result{Name: r.Name, Errors: convert(r.Errors), Warnings: convert(r.Warnings)})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	if failed {
		os.Exit(1)
	}
}
