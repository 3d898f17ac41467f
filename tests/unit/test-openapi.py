"""docs/openapi.yaml describes exactly the routes airlockd serves: the same (method, path)
pairs as `airlockd routes`, every path parameter declared, every operation answering something.

Usage: test-openapi.py AIRLOCKD OPENAPI_YAML
"""
import re
import subprocess
import sys

import yaml

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def main():
    airlockd, spec_path = sys.argv[1], sys.argv[2]
    out = subprocess.run([airlockd, "--config", "/dev/null", "routes"], stdout=subprocess.PIPE,
                         check=True).stdout.decode()
    served = {tuple(line.split(" ", 1)) for line in out.splitlines() if line}
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    assert spec["openapi"].startswith("3."), "not an OpenAPI 3 document"
    documented = set()
    problems = []
    for path, item in spec["paths"].items():
        params = {p.get("name") for p in item.get("parameters", []) if "name" in p}
        params |= {p["$ref"].rsplit("/", 1)[1] for p in item.get("parameters", []) if "$ref" in p}
        for method, op in item.items():
            if method not in METHODS:
                continue
            documented.add((method.upper(), path))
            if not op.get("responses"):
                problems.append("%s %s: no responses" % (method, path))
            names = params | {p.get("name") for p in op.get("parameters", [])}
            for name in re.findall(r"{(\w+)}", path):
                if name not in names:
                    problems.append("%s %s: path parameter {%s} not declared" % (method, path, name))
    for m, p in sorted(served - documented):
        problems.append("served but not in openapi.yaml: %s %s" % (m, p))
    for m, p in sorted(documented - served):
        problems.append("in openapi.yaml but not served: %s %s" % (m, p))
    print("1..1")
    if problems:
        for p in problems:
            print("# " + p)
        print("not ok 1 - openapi.yaml matches the route table")
        return 1
    print("ok 1 - openapi.yaml matches the route table (%d routes)" % len(served))
    return 0


if __name__ == "__main__":
    sys.exit(main())
