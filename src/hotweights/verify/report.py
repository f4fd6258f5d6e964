"""Verify's outputs: a verdict table on the terminal, ``report.md``, a self-contained
``report.html`` (inline SVG charts: each start as a bar split into its phases, memory at
four points) and ``receipts.json``. Stdlib + rich (terminal only).

The time-to-ready comparison is the disk baseline against the first warm start, with the
page-cache state of the disk start stated, and one sentence of what the cache saved.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from ..evidence import STANDBY_USED_RE


# the weights phase in a strong colour, every other phase in muted ones
PHASE_COLOURS = {"imports": "#9aa5b1", "cuda_context": "#b8c2cc", "tokenizer": "#cfd6dd", "model_build": "#7b8794",
                 "weights": "#e8590c", "warmup": "#52606d", "listening": "#dde3e8",  # the embedded server's
                 "engine_start": "#b8c2cc", "workers_start": "#aab4be", "compile": "#7b8794",  # vLLM's (vllm_log)
                 "cuda_graphs": "#52606d", "engine_rest": "#cfd6dd", "api": "#dde3e8"}

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
    lines += ["", "## Time to ready", ""]
    sentence = saved_sentence(receipts)
    if sentence:
        lines += [sentence, ""]
    lines += ["| run | ready | seconds | weights s | page cache at start | phases (s) |", "|---|---|---|---|---|---|"]
    for label, r in receipts["runs"].items():
        phases = r.get("phases") or {}
        pc = r.get("page_cache")
        weights = r.get("weights_s", phases.get("weights"))
        lines.append(f"| {label} | {r['ready']} | {r['elapsed_s']} | {'' if weights is None else weights} | "
                     f"{'' if pc is None else f'{pc:.0%}'} | "
                     f"{', '.join(f'{k} {v}' for k, v in phases.items())} |")
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


def saved_sentence(receipts: dict) -> str | None:
    """What the cache saved, the disk starts (page cache warm, and evicted when run) vs the first warm start,
    in one sentence (None without a disk and a warm start)."""
    runs = receipts["runs"]
    disk, warm, cold = runs.get("disk"), runs.get("warm1"), runs.get("disk_cold")
    if not (disk and warm and disk["ready"] and warm["ready"]):
        return None
    cold = cold if cold and cold["ready"] else None
    d, w = float(disk["elapsed_s"]), float(warm["elapsed_s"])

    def state(run: dict) -> str:
        pc = run.get("page_cache")
        return "page cache state unknown" if pc is None else f"{pc:.0%} of the checkpoint in the page cache"

    text = f"Warm start ready in {w:.2f} s; disk start {d:.2f} s with the page cache warm ({state(disk)})"
    if receipts["env"].get("engine") == "vllm":
        used = [any(STANDBY_USED_RE.search(e) for e in r.get("evidence", [])) for r in (warm, disk)]
        which = ("both" if all(used) else "the warm start only" if used[0] else "the disk one only" if used[1]
                 else "neither")
        text += f" (from a warm standby: {which})"
    if cold:
        text += f" and {float(cold['elapsed_s']):.2f} s with it evicted first ({state(cold)}: read from the drive)"

    def weights(run: dict | None, what: str) -> str:
        return f", {run['weights_s']:.3f} s {what}" if run and run.get("weights_s") is not None else ""

    if warm.get("weights_s") is not None and disk.get("weights_s") is not None:
        name = ("vLLM's weight phase (its \"Model loading took\")" if receipts["env"].get("engine") == "vllm"
                else "the weights phase")
        text += (f"; {name}: {disk['weights_s']:.3f} s from disk (page cache warm){weights(cold, 'evicted')}, "
                 f"{warm['weights_s']:.3f} s from the cache")
        rest = w - warm["weights_s"]
        others = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in (warm.get("phases") or {}).items()
                           if k != "weights" and v > 0)
        text += (f"; the other {rest:.2f} s of the warm start{f' ({others})' if others else ''} are paid by every "
                 f"start, cached or not")
    floor, device = receipts["env"].get("floor_s"), str(receipts["env"].get("device", ""))
    if w >= d:  # said plainly: a PASS is about the cache being used and right, not about this start's time
        why = ("vLLM's CPU build compiles again on every start, which no cache keeps" if
               receipts["env"].get("engine") == "vllm" and not device.startswith("cuda") else
               "the rest of the start outweighs the weights here")
        text += f". The cache did not make this start faster ({w:.2f} s vs {d:.2f} s from disk): {why}"
    if floor:
        what = "importing torch and creating a CUDA context" if device.startswith("cuda") else "importing torch"
        text += f" (the floor, a fresh python {what}, took {floor:.2f} s)"
    waited = [f"{label} {r['phases']['imports']:.1f} s" for label, r in runs.items() if r.get("ready")
              and (r.get("phases") or {}).get("imports", 0) > 5 and any(STANDBY_USED_RE.search(e)
                                                                        for e in r.get("evidence", []))]
    if waited:  # the launcher waited for a standby the start before had begun importing once it was ready
        text += (f". Waited for a warm standby still importing: {', '.join(waited)} (each start prepares the "
                 f"next one's standby once it is ready; a restart sooner than its imports pays the rest)")
    return text + "."


def _phase_bars(runs: dict) -> str:
    """Each ready start as one bar split into its phases (the weights phase stands out); a plain bar
    for servers without a startup line (vLLM)."""
    ready = [(label, r) for label, r in runs.items() if r["ready"] and label != "preload"]  # starts only
    width, row, left = 640, 30, 120
    top = max((float(r["elapsed_s"]) for _, r in ready), default=1.0) or 1.0
    scale = (width - left - 190) / top  # room after the longest bar for "12.34 s, weights 1.234 s"
    # the legend names the phases that took time in some start (no cuda_context on a CPU run), wrapped
    shown = [p for p in dict.fromkeys(p for _, r in ready for p in r.get("phases") or ())
             if any((r.get("phases") or {}).get(p, 0.0) > 0 for _, r in ready)]
    legend, x, y = [], 0, 28 + len(ready) * row + 8
    for phase in shown:
        if x + 16 + 8 * len(phase) > width:
            x, y = 0, y + 18
        legend.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{PHASE_COLOURS[phase]}"/>'
                      f'<text x="{x + 16}" y="{y + 11}" font-size="12">{phase}</text>')
        x += 16 + 8 * len(phase) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 30}">',
             '<text x="0" y="16" font-weight="bold">seconds from process start to /health 200, by phase</text>']
    for i, (label, r) in enumerate(ready):
        y, x = 28 + i * row, float(left)
        parts.append(f'<text x="0" y="{y + 15}">{html.escape(label)}</text>')
        for phase in r.get("phases") or ():
            w = r["phases"].get(phase, 0.0) * scale
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="20" '
                         f'fill="{PHASE_COLOURS[phase]}"><title>{phase} {r["phases"].get(phase, 0.0)} s</title></rect>')
            x += w
        if not r.get("phases"):
            x += float(r["elapsed_s"]) * scale
            parts.append(f'<rect x="{left}" y="{y}" width="{x - left:.1f}" height="20" fill="#4a7ebb"/>')
        w_s = r.get("weights_s", (r.get("phases") or {}).get("weights"))
        weights = "" if w_s is None else f", weights {w_s:.3f} s"
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{float(r["elapsed_s"]):.2f} s{weights}</text>')
    return "".join(parts + legend) + "</svg>"


def html_report(receipts: dict) -> str:
    memory = [(name, _memory_value(receipts["memory"][k])) for k, name in MEMORY_POINTS if k in receipts["memory"]]
    rows = "".join(f"<tr><td>{html.escape(c['name'])}</td><td class={'pass' if c['passed'] else 'fail'}>"
                   f"{'pass' if c['passed'] else 'FAIL'}</td><td>{html.escape(c['detail'])}</td></tr>"
                   for c in receipts["checks"])
    verdict = "PASS" if receipts["passed"] else "FAIL"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>hotweights verify: {verdict}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}td{{padding:4px 8px;border-bottom:1px solid #ddd}}
.pass{{color:#17803d;font-weight:bold}}.fail{{color:#c0392b;font-weight:bold}}pre{{background:#f4f4f4;padding:8px}}</style>
</head><body><h1>hotweights verify: <span class={verdict.lower()}>{verdict}</span></h1>
<table>{rows}</table><h2>Time to ready</h2><p>{html.escape(saved_sentence(receipts) or "")}</p>
{_phase_bars(receipts["runs"])}
<h2>Memory at four points</h2>{_bars("GiB", memory, "GiB")}
<h2>Environment</h2><pre>{html.escape(json.dumps(receipts["env"], indent=2))}</pre></body></html>
"""


def write_reports(receipts: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "receipts.json").write_text(json.dumps(receipts, indent=2))
    (out / "report.md").write_text(markdown(receipts))
    (out / "report.html").write_text(html_report(receipts))
