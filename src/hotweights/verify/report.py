"""Verify's outputs: a verdict table on the terminal, ``report.md``, a self-contained
``report.html`` (inline SVG charts: time-to-ready per run, memory at four points) and
``receipts.json``. Stdlib + rich (terminal only).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

MEMORY_POINTS = [("none", "nothing running"), ("daemon_only", "daemon only"),
                 ("daemon_engine", "daemon + engine"), ("engine_stopped", "engine stopped")]


def _memory_value(sample: dict) -> float:
    """GiB: GPU used memory when measured, else pools + daemon + engine private memory."""
    if sample.get("gpu_used_mib"):
        return sum(sample["gpu_used_mib"].values()) / 1024
    return sample.get("total_bytes", 0) / 2**30


def print_verdict(receipts: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"hotweights verify: {'PASS' if receipts['passed'] else 'FAIL'}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in receipts["checks"]:
        table.add_row(c["name"], "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]", c["detail"])
    console = Console()
    console.print(table)
    for c in receipts["checks"]:
        if not c["passed"]:
            console.print(f"[red]failed:[/red] {c['name']}: {c['detail']}")
    console.print(f"report: {out / 'report.html'} and {out / 'report.md'}; receipts in {out}")


def markdown(receipts: dict) -> str:
    env = receipts["env"]
    lines = [f"# hotweights verify: {'PASS' if receipts['passed'] else 'FAIL'}", "",
             f"- model: `{env.get('model')}` ({env.get('arch')}, {env.get('dtype')}, digest {env.get('model_digest')})",
             f"- engine: {env.get('engine')} on {env.get('device')} (TP {env.get('tp')}, DP {env.get('dp')})",
             f"- machine: {env.get('cpu')} x{env.get('cpus')}" + (f", GPU {env['gpu']}" if env.get("gpu") else ""),
             f"- versions: {', '.join(f'{k} {v}' for k, v in env.get('versions', {}).items())}", "",
             "| check | result | detail |", "|---|---|---|"]
    for c in receipts["checks"]:
        lines.append(f"| {c['name']} | {'pass' if c['passed'] else '**FAIL**'} | {c['detail'].replace('|', '/')} |")
    lines += ["", "## Time to ready", "", "| run | ready | seconds |", "|---|---|---|"]
    for label, r in receipts["runs"].items():
        lines.append(f"| {label} | {r['ready']} | {r['elapsed_s']} |")
    lines += ["", "## Memory", "", "| point | GiB | detail |", "|---|---|---|"]
    for key, name in MEMORY_POINTS:
        sample = receipts["memory"].get(key)
        if sample:
            lines.append(f"| {name} | {_memory_value(sample):.2f} | `{json.dumps(sample, sort_keys=True)}` |")
    return "\n".join(lines) + "\n"


def _bars(title: str, items: list[tuple[str, float]], unit: str) -> str:
    width, row = 640, 28
    top = max((v for _, v in items), default=1.0) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{row * len(items) + 40}">',
             f'<text x="0" y="16" font-weight="bold">{html.escape(title)}</text>']
    for i, (label, value) in enumerate(items):
        y = 28 + i * row
        w = int((width - 260) * value / top)
        parts.append(f'<text x="0" y="{y + 15}">{html.escape(label)}</text>'
                     f'<rect x="170" y="{y}" width="{max(w, 1)}" height="20" fill="#4a7ebb"/>'
                     f'<text x="{176 + w}" y="{y + 15}">{value:.2f} {unit}</text>')
    return "".join(parts) + "</svg>"


def html_report(receipts: dict) -> str:
    runs = [(k, float(r["elapsed_s"])) for k, r in receipts["runs"].items() if r["ready"]]
    memory = [(name, _memory_value(receipts["memory"][k])) for k, name in MEMORY_POINTS if k in receipts["memory"]]
    rows = "".join(f"<tr><td>{html.escape(c['name'])}</td><td class={'pass' if c['passed'] else 'fail'}>"
                   f"{'pass' if c['passed'] else 'FAIL'}</td><td>{html.escape(c['detail'])}</td></tr>"
                   for c in receipts["checks"])
    verdict = "PASS" if receipts["passed"] else "FAIL"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>hotweights verify: {verdict}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}td{{padding:4px 8px;border-bottom:1px solid #ddd}}
.pass{{color:#17803d;font-weight:bold}}.fail{{color:#c0392b;font-weight:bold}}pre{{background:#f4f4f4;padding:8px}}</style>
</head><body><h1>hotweights verify: <span class={verdict.lower()}>{verdict}</span></h1>
<table>{rows}</table><h2>Time to ready</h2>{_bars("seconds from process start to /health 200", runs, "s")}
<h2>Memory at four points</h2>{_bars("GiB", memory, "GiB")}
<h2>Environment</h2><pre>{html.escape(json.dumps(receipts["env"], indent=2))}</pre></body></html>
"""


def write_reports(receipts: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "receipts.json").write_text(json.dumps(receipts, indent=2))
    (out / "report.md").write_text(markdown(receipts))
    (out / "report.html").write_text(html_report(receipts))
