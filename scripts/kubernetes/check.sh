#!/usr/bin/env bash
# Check deploy/kubernetes/: every manifest against the Kubernetes API's schemas and
# prometheus-operator's CRDs (kubeconform, strict: an unknown field fails), and the
# PrometheusRule's rules equal to deploy/prometheus/alerts.yml (`--write` regenerates it).
#
#   bash scripts/kubernetes/check.sh [--write]
#
# Fetches what it lacks into target/kubernetes/ (Go modules and PyPI): kubeconform, the
# Kubernetes JSON schemas (kubernetes-validate's), prometheus-operator's CRDs. Exit 2 when a
# tool cannot be had, 1 when a manifest is wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."
KUBECONFORM_VERSION=v0.7.0
K8S_SCHEMAS_VERSION=1.37.0
OPERATOR_VERSION=v0.85.0
work=target/kubernetes
mkdir -p "$work"
die() { echo "check.sh: $*" >&2; exit 2; }

# The PrometheusRule holds alerts.yml's groups.
python3 - "${1:-}" <<'PY' || exit 1
import sys, yaml
rules = yaml.safe_load(open("deploy/prometheus/alerts.yml"))
path = "deploy/kubernetes/prometheusrule.yaml"
header = ("# Made from deploy/prometheus/alerts.yml by scripts/kubernetes/check.sh --write (which\n"
          "# checks that they agree): edit alerts.yml, then regenerate.\n")
rule = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "virtprof", "namespace": "virtprof", "labels": {"app.kubernetes.io/name": "virtprof"}},
    "spec": {"groups": rules["groups"]},
}
text = header + yaml.safe_dump(rule, sort_keys=False, width=100)
if sys.argv[1] == "--write":
    open(path, "w").write(text)
elif open(path).read() != text:
    sys.exit(f"check.sh: {path} differs from deploy/prometheus/alerts.yml: run scripts/kubernetes/check.sh --write")
PY

kubeconform=$work/bin/kubeconform
if [ ! -x "$kubeconform" ]; then
    command -v go >/dev/null || die "go not found (needed to install kubeconform)"
    GOBIN=$PWD/$work/bin go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" ||
        die "could not install kubeconform $KUBECONFORM_VERSION"
fi
schemas=$PWD/$work/kubernetes-json-schema/v$K8S_SCHEMAS_VERSION-local-strict
if [ ! -d "$schemas.refs" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps "kubernetes-validate==$K8S_SCHEMAS_VERSION" -d "$tmp" ||
        die "could not download kubernetes-validate $K8S_SCHEMAS_VERSION (its JSON schemas)"
    python3 -m zipfile -e "$tmp"/kubernetes_validate-*.whl "$tmp/whl"
    mkdir -p "$work/kubernetes-json-schema"
    mv "$tmp/whl/kubernetes_validate/kubernetes-json-schema/v$K8S_SCHEMAS_VERSION-local-strict" "$schemas.refs"
    rm -rf "$tmp"
fi
# kubeconform reads one file per kind: each kind the manifests use, with its references to
# the shared definitions written in (a definition that contains itself is left open there).
mkdir -p "$schemas"
python3 - "$schemas.refs" "$schemas" deploy/kubernetes/*.yaml <<'PY'
import json, os, sys, yaml
src, out, manifests = sys.argv[1], sys.argv[2], sys.argv[3:]
defs = json.load(open(os.path.join(src, "_definitions.json")))["$defs"]
def inline(node, chain):
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith(("/api/_definitions.json#/$defs/", "#/$defs/")):
            name = ref.rsplit("/", 1)[1]
            rest = {k: inline(v, chain) for k, v in node.items() if k != "$ref"}
            return dict(rest, **({} if name in chain else inline(defs[name], chain | {name})))
        return {k: inline(v, chain) for k, v in node.items() if k not in ("$id", "$schema")}
    if isinstance(node, list):
        return [inline(v, chain) for v in node]
    return node
for path in manifests:
    for doc in yaml.safe_load_all(open(path)):
        group, _, version = doc["apiVersion"].rpartition("/")
        name = doc["kind"].lower() + "-" + (group.split(".")[0] + "-" if group else "") + version + ".json"
        if os.path.exists(os.path.join(src, name)) and not os.path.exists(os.path.join(out, name)):
            json.dump(inline(json.load(open(os.path.join(src, name))), frozenset()), open(os.path.join(out, name), "w"))
PY
crds=$PWD/$work/crds
if [ ! -d "$crds/monitoring.coreos.com" ]; then
    dir=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$OPERATOR_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') ||
        die "could not download prometheus-operator $OPERATOR_VERSION (its CRDs)"
    # Each CRD version's openAPIV3Schema as a JSON schema, strict: objects that list their
    # properties take no others.
    python3 - "$dir/example/prometheus-operator-crd" "$crds" <<'PY'
import glob, json, os, sys, yaml
src, out = sys.argv[1:3]
# A bare `=` (an enum value in some CRDs) is YAML's rarely used value tag: read it as text.
yaml.SafeLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))
def strict(node):
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            strict(v)
    elif isinstance(node, list):
        for v in node:
            strict(v)
for path in glob.glob(os.path.join(src, "*.yaml")):
    crd = yaml.safe_load(open(path))
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"].lower()
    os.makedirs(os.path.join(out, group), exist_ok=True)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        strict(schema)
        json.dump(schema, open(os.path.join(out, group, f"{kind}_{version['name']}.json"), "w"))
PY
fi
"$kubeconform" -strict -summary -kubernetes-version "$K8S_SCHEMAS_VERSION" \
    -schema-location "$schemas/{{.ResourceKind}}{{.KindSuffix}}.json" \
    -schema-location "$crds/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json" \
    deploy/kubernetes/*.yaml
