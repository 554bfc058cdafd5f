#!/usr/bin/env python3
"""Checks a Grafana dashboard file against the dashboard types of Grafana's own
grafana-foundation-sdk (PyPI, pinned by scripts/setup): the file is read with
`Dashboard.from_json`, written back with the SDK's encoder, and every field of the file must
come back with the same value (the SDK drops what its schema does not know and may add
defaults; additions are fine). Also: every panel type is one the SDK has a model for.

Usage: .venv/bin/python observability/check-dashboard.py [FILE]
(default observability/grafana-dashboard.json); run by tests/e2e/observability.rs."""
import json
import os
import pkgutil
import sys

from grafana_foundation_sdk.cog import encoder
from grafana_foundation_sdk.models import dashboard
import grafana_foundation_sdk.models as models

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "observability", "grafana-dashboard.json")
original = json.load(open(path))
written = json.loads(json.dumps(dashboard.Dashboard.from_json(original), cls=encoder.JSONEncoder))

problems = []


def compare(want, got, where):
    if isinstance(want, dict):
        if not isinstance(got, dict):
            problems.append(f"{where}: an object became {json.dumps(got)[:60]}")
            return
        for key, value in want.items():
            if key not in got:
                problems.append(f"{where}/{key}: unknown to the dashboard schema (dropped)")
            else:
                compare(value, got[key], f"{where}/{key}")
    elif isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            problems.append(f"{where}: a list of {len(want)} came back as {json.dumps(got)[:60]}")
            return
        for i, (w, g) in enumerate(zip(want, got)):
            compare(w, g, f"{where}[{i}]")
    elif want != got:
        problems.append(f"{where}: {json.dumps(want)[:60]} came back as {json.dumps(got)[:60]}")


compare(original, written, "")
known = {m.name.replace("_", "") for m in pkgutil.iter_modules(models.__path__)} | {"row"}
panels = [p for p in original.get("panels", []) if p.get("type") != "row"]
for panel in original.get("panels", []):
    kind = panel.get("type", "").replace("-", "")
    if kind not in known:
        problems.append(f"panel {panel.get('id')}: type {panel.get('type')} has no SDK model")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"{path}: {len(panels)} panels, every field known to the dashboard schema")
