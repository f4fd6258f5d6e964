"""The package's import graph has no circle, counting imports made inside functions too (they hide a
circle from import time, not from the design: the budget once built the loader that imports the
patches that import the budget).

Run: pytest tests/test_imports.py
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph() -> dict[str, set[str]]:
    files = {}
    for path in (SRC / "hotweights").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = {f"{target}.{a.name}" for a in node.names} & files.keys()
                graph[name] |= (subs or {target}) & files.keys() - {name}
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & files.keys() - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    order, low, stack, found = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    assert circles(import_graph()) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_keeper_the_standbys_zygote_and_the_switchs_front_load_no_torch_and_no_vllm():
    """The processes that must start in milliseconds and stay small (DESIGN: a torch-free keeper daemon; a zygote
    that imports the engine only when asked; a front that holds no CUDA context) import neither, in a fresh
    interpreter (imports inside functions are not run by an import, so they do not count here)."""
    import subprocess
    import sys

    heavy = ("torch", "vllm", "transformers", "safetensors", "triton")
    code = ("import sys; import hotweights.keeper.main, hotweights.keeper.init, hotweights.standby.zygote, "
            "hotweights.switch.port.front, hotweights.cli_switch, hotweights.parked.watch; "
            f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], done.stdout


def test_only_the_cluster_package_imports_ray():
    """The keeper, the front and the engines stay Ray-free (DESIGN: past one machine): only ``hotweights.cluster``
    imports Ray, and the ``cluster`` command inside its function; so the import graph says, and a fresh interpreter
    that loads the keeper, the front and the whole command line loads no Ray."""
    import subprocess
    import sys

    offenders = []
    for path in (SRC / "hotweights").rglob("*.py"):
        inside = path.relative_to(SRC / "hotweights").parts[0] in ("cluster", "cli_cluster.py")  # the latter: lazily
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] == "ray" for n in names) and not inside:
                offenders.append(str(path.relative_to(SRC)))
    assert offenders == []
    code = ("import sys; import hotweights.keeper.main, hotweights.switch.port.front, hotweights.cli, "
            "hotweights.serve.app; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'ray')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], done.stdout


def test_the_command_lines_parser_builds_without_the_cluster_extra():
    """Every command's parser is built at each start (the cluster's included): it must not need Ray, tomli-w or
    pydantic, which a base install, or vLLM's own environment, lacks (a review's move once made every CLI start
    there fail on ``import tomli_w``)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules.update(ray=None, tomli_w=None, pydantic=None); "
            "from hotweights import cli; cli.main(['--version'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "hotweights" in done.stdout, done.stderr


def test_the_switch_reaches_vllm_only_through_its_kinds_table():
    """Review f, move 4: ``switch/kinds.py`` is the switch's one door to vLLM: no other switch module imports from
    ``engines/vllm`` (but the worker's budget rule, which the memory model shares) or names the kind in code."""
    graph = import_graph()
    switch = {name for name in graph if name.startswith("hotweights.switch.")}
    through = {name: sorted(t for t in graph[name] if t.startswith("hotweights.engines.vllm"))
               for name in switch - {"hotweights.switch.kinds"}}
    assert {name: t for name, t in through.items() if t} == {
        "hotweights.switch.memory": ["hotweights.engines.vllm.budget"]}
    named = []
    for path in (SRC / "hotweights" / "switch").glob("*.py"):
        if path.name == "kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "vllm":
                named.append(f"{path.name}:{node.lineno}")
    assert named == []


def test_the_switchs_port_reaches_its_core_through_one_door():
    """Review f, move 5: the port (``switch/port/``) imports neither the lifecycle nor the admission; it asks the
    switch through ``door.SwitchPort``. No folder of the switch imports a folder above it: the core imports
    ``upstream/`` and nothing of ``port/``; ``upstream/`` imports nothing of ``port/``."""
    graph = import_graph()
    port = {n for n in graph if n.startswith("hotweights.switch.port.")}
    upstream = {n for n in graph if n.startswith("hotweights.switch.upstream.")}
    core = {n for n in graph if n.startswith("hotweights.switch.")} - port - upstream
    assert port and upstream
    assert {n: sorted(graph[n] & {"hotweights.switch.lifecycle", "hotweights.switch.admission"}) for n in port
            if graph[n] & {"hotweights.switch.lifecycle", "hotweights.switch.admission"}} == {}
    assert sorted(n for n in core if graph[n] & port) == []
    assert sorted(n for n in upstream if graph[n] & port) == []
