#!/usr/bin/env python3
"""Print the paths of the kernel modules NAME... under MODULES_DIR and of every module they
depend on (read from each module's .modinfo), in load order; a name with no .ko is built in.
The test beds load these into their L1 kernels (scripts/nested-svm, scripts/arm64).

    python3 scripts/module-order.py MODULES_DIR NAME...
"""
import os, sys
root, wanted = sys.argv[1], sys.argv[2:]
paths = {}
for base, _, files in os.walk(root):
    for f in files:
        if f.endswith(".ko"):
            paths[f[:-3].replace("-", "_")] = os.path.join(base, f)
order = []
def visit(name):
    name = name.replace("-", "_")
    if name in order or name not in paths:  # built into the kernel
        return
    # The .modinfo section holds NUL-separated key=value strings, one of them depends=.
    data = open(paths[name], "rb").read()
    at = data.find(b"\0depends=")
    deps = data[at + 9:data.index(b"\0", at + 1)].decode() if at >= 0 else ""
    for dep in filter(None, deps.split(",")):
        visit(dep)
    order.append(name)
for name in wanted:
    visit(name)
for name in order:
    print(paths[name])
