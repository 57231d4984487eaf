// Package openshell holds Tether's own minimal copy of the OpenShell gateway's
// gRPC API (service openshell.v1.OpenShell, reference/wire-facts.md §1): the
// .proto sources under proto/ (packages openshell.v1, openshell.datamodel.v1
// and openshell.sandbox.v1, with the gateway's message names and field
// numbers), the Go code protoc-gen-go generates from them (*.pb.go, committed,
// DO NOT EDIT), the full method paths (methods.go), and the pure rules the
// fake gateway and the facade share: sandbox names, labels and label
// selectors (validate.go).
//
// Only the sandbox lifecycle, exec and watch RPCs are declared. Fields the
// gateway has and this subset lacks are kept as unknown fields on decode and
// written back unchanged, so a message that passes through survives intact;
// the facade forwards raw bytes in any case.
//
// There are no generated gRPC stubs: protocol packages must not import grpc
// (cmd/internal/repocheck). Callers invoke methods by their full path, e.g.
// conn.Invoke(ctx, MethodGetSandbox, req, resp). The package starts no
// goroutines and imports only the standard library and the protobuf runtime.
// The fake gateway lives in the sub-package openshelltest.
//
// Regenerate with `make generate`, which installs protoc-gen-go at the pinned
// version v1.36.12 into bin/tools and runs the go:generate line below with
// protoc (any protoc with proto3 optional support, ≥ 3.15).
package openshell

//go:generate protoc -I proto --go_out=. --go_opt=paths=source_relative proto/openshell.proto proto/datamodel.proto proto/sandbox.proto
