"""The cluster's choices, pure (``cluster/warmth.py``, ``cluster/config.py``): a model's warmth from a front's status
row, the rank of nodes for one request (warmth, then spreading a hot model, stale and unhealthy nodes last), the
placement of models on nodes (rendezvous hashing), and each node's front config. No Ray.

Run: pytest tests/test_cluster_warmth.py
"""

from __future__ import annotations

import tomllib

import pytest

from hotweights.cluster.config import ClusterConfigError, parse
from hotweights.cluster.warmth import NodeReport, Warmth, placed, rank, warmth_of

W = Warmth


@pytest.mark.parametrize(("row", "warmth"), [
    ({"state": "awake"}, W.AWAKE),
    ({"state": "leaving"}, W.PARKED),
    ({"state": "parked"}, W.PARKED),
    ({"state": "deep-parked"}, W.HOST),
    ({"state": "starting"}, W.HOST),
    ({"state": "stopped", "cached": "cached"}, W.CACHED),
    ({"state": "stopped", "cached": "cached already"}, W.CACHED),
    ({"state": "stopped", "cached": "not cached (no keeper)"}, W.ABSENT),
    ({"state": "stopped", "cached": None}, W.ABSENT),
    ({"state": "failed", "cached": "cached"}, W.ABSENT),
])
def test_a_status_rows_state_gives_its_warmth(row, warmth):
    assert warmth_of(row) is warmth


def report(node: str, at: float = 100.0, healthy: bool = True, **models: tuple[Warmth, int]) -> NodeReport:
    return NodeReport(node, at, healthy, sum(q for _w, q in models.values()), dict(models))


def ranked(reports, model="m", spread_at=4, now=100.5, sent=None):
    return rank(reports, model, spread_at=spread_at, now=now, stale_after_s=3.0, sent=sent)


# each row: the nodes' (warmth, queue) for model m, and the groups the router tries in order
RANKS = [
    ("awake before parked before host before cached before absent",
     {"a": (W.ABSENT, 0), "b": (W.CACHED, 0), "c": (W.HOST, 0), "d": (W.PARKED, 0), "e": (W.AWAKE, 0)},
     [["e"], ["d"], ["c"], ["b"], ["a"]]),
    ("equal warmth is one group (Ray takes the fewest in flight)",
     {"a": (W.PARKED, 0), "b": (W.PARKED, 2), "c": (W.CACHED, 0)}, [["a", "b"], ["c"]]),
    ("a queue at the bound ranks an awake node after a parked one",
     {"a": (W.AWAKE, 4), "b": (W.PARKED, 0), "c": (W.CACHED, 0)}, [["b"], ["a"], ["c"]]),
    ("... but before host memory and a start: a queue is cheaper than a start",
     {"a": (W.AWAKE, 9), "b": (W.HOST, 0), "c": (W.ABSENT, 0)}, [["a"], ["b"], ["c"]]),
    ("under the bound it stays where it is awake",
     {"a": (W.AWAKE, 3), "b": (W.PARKED, 0)}, [["a"], ["b"]]),
]


@pytest.mark.parametrize(("why", "nodes", "groups"), RANKS, ids=[r[0] for r in RANKS])
def test_the_router_ranks_nodes_by_the_models_warmth_then_its_queue(why, nodes, groups):
    reports = {k: report(k, m=wq) for k, wq in nodes.items()}
    assert ranked(reports) == groups, why


def test_what_this_router_sent_since_a_report_counts_toward_the_bound():
    reports = {"a": report("a", m=(W.AWAKE, 2)), "b": report("b", m=(W.PARKED, 0))}
    assert ranked(reports, sent={"a": 1}) == [["a"], ["b"]]
    assert ranked(reports, sent={"a": 2}) == [["b"], ["a"]]


def test_a_model_sent_to_a_node_since_its_report_is_awake_there_so_a_second_request_follows_it():
    """Two requests for a model parked on two nodes within one stats period: the second goes where the first woke
    it, not to wake it on the other node too."""
    reports = {"a": report("a", m=(W.PARKED, 0)), "b": report("b", m=(W.PARKED, 0))}
    assert ranked(reports) == [["a", "b"]]
    assert ranked(reports, sent={"b": 1}) == [["b"], ["a"]]
    reports = {"a": report("a", m=(W.CACHED, 0)), "b": report("b", m=(W.PARKED, 0))}
    assert ranked(reports, sent={"a": 1}) == [["a"], ["b"]], "a start under way beats a second wake"


def test_a_wake_that_would_park_another_model_ranks_after_one_into_a_free_place():
    full = NodeReport("a", 100.0, True, 0, {"m": (W.PARKED, 0)}, room=0)
    free = NodeReport("b", 100.0, True, 0, {"m": (W.PARKED, 0)}, room=1)
    unknown = NodeReport("c", 100.0, True, 0, {"m": (W.PARKED, 0)}, room=None)  # max_awake "auto": memory decides
    assert ranked({"a": full, "b": free, "c": unknown}) == [["b", "c"], ["a"]]
    host = NodeReport("d", 100.0, True, 0, {"m": (W.HOST, 0)}, room=1)
    assert ranked({"a": full, "d": host}) == [["a"], ["d"]], "still warmer than host memory"


def test_a_model_awake_on_several_nodes_goes_to_its_home_until_its_queue_there_reaches_the_bound():
    """The default model awake on every node: each request goes to one of them (the same whoever asks), so that the
    others' places free up for other models, and to the next awake node once its home has a queue."""
    reports = {k: report(k, m=(W.AWAKE, 0)) for k in "abc"}
    home = ranked(reports)[0]
    assert len(home) == 1 and ranked(dict(reversed(reports.items())))[0] == home
    others = sorted(set("abc") - set(home))
    assert ranked(reports) == [home, others]
    reports[home[0]] = report(home[0], m=(W.AWAKE, 4))
    assert ranked(reports)[0] == others, "its home has a queue at the bound: the other awake nodes first"
    reports = {"a": report("a", m=(W.AWAKE, 0)), "b": report("b", m=(W.PARKED, 0))}
    assert ranked(reports) == [["a"], ["b"]], "awake on one node only: no home to prefer"
    reports["c"] = report("c", m=(W.PARKED, 0))
    groups = ranked(reports, sent={"b": 1})
    assert sorted(groups[0] + groups[1]) == ["a", "b"] and groups[2] == ["c"], "awake away before a wake"


def test_a_model_a_node_does_not_report_is_absent_there():
    reports = {"a": report("a", other=(W.AWAKE, 0)), "b": report("b", m=(W.CACHED, 0))}
    assert ranked(reports) == [["b"], ["a"]]


def test_stale_unhealthy_and_silent_nodes_rank_last_in_one_group():
    reports = {"stale": report("stale", at=90.0, m=(W.AWAKE, 0)), "sick": report("sick", healthy=False),
               "new": None, "ok": report("ok", m=(W.ABSENT, 0))}
    groups = ranked(reports)
    assert groups[0] == ["ok"] and sorted(groups[1]) == ["new", "sick", "stale"]


def test_a_report_survives_rays_stats_as_plain_values():
    r = NodeReport("n1", 100.0, True, 4, {"m": (W.PARKED, 3), "k": (W.AWAKE, 1)}, room=1)
    stats = r.to_stats()
    assert stats["models"] == {"m": [1, 3], "k": [0, 1]} and stats["room"] == 1
    assert NodeReport.from_stats(stats) == r
    assert NodeReport.from_stats({}) is None


def test_a_report_from_a_fronts_status_counts_waiting_and_in_flight():
    status = {"max_awake": 2, "models": [{"name": "a", "state": "awake", "inflight": 2, "waiting": 1},
                                         {"name": "b", "state": "stopped", "cached": "cached", "inflight": 0,
                                          "waiting": 3}]}
    r = NodeReport.from_status("n", status, at=5.0)
    assert r.models == {"a": (W.AWAKE, 3), "b": (W.CACHED, 3)} and r.inflight == 6 and r.healthy
    assert r.room == 1 and NodeReport.from_status("n", {**status, "max_awake": "auto"}).room is None
    assert not NodeReport.from_status("n", None).healthy


def test_placement_picks_the_same_nodes_whoever_asks_and_moves_little_when_a_node_leaves():
    nodes = [f"node{i}" for i in range(6)]
    models = [f"model{i}" for i in range(40)]
    before = {m: placed(m, nodes, 2) for m in models}
    assert all(len(p) == 2 for p in before.values())
    assert before == {m: placed(m, list(reversed(nodes)), 2) for m in models}  # order does not matter
    counts = [sum(n in p for p in before.values()) for n in nodes]
    assert min(counts) >= 6, counts  # 80 places over 6 nodes, none left out
    after = {m: placed(m, nodes[:-1], 2) for m in models}
    moved = [m for m in models if before[m] - {"node5"} != after[m] - {"node5"} or len(after[m]) != 2]
    assert all("node5" in before[m] for m in moved), "only the models the gone node held move"
    assert placed("x", nodes, None) == set(nodes) and placed("x", nodes[:1], 2) == {"node0"}


CONFIG = """
[switch]
max_awake = 2

[cluster]
ready_nodes = 1
socket_root = "/tmp/hwc"

[[model]]
name = "a"
checkpoint = "/models/a"

[[model]]
name = "b"
checkpoint = "/models/b"
aliases = ["bee"]
default = true

[[model]]
name = "c"
checkpoint = "/models/c"
ready_nodes = "all"
"""


def test_each_nodes_front_config_keeps_its_placed_models_ready_and_the_rest_lazy(tmp_path):
    cluster = parse(CONFIG, tmp_path / "c.toml")
    assert cluster.default.name == "b" and cluster.routes == {"a": "a", "b": "b", "bee": "b", "c": "c"}
    nodes = ["n0", "n1", "n2"]
    starts = {}
    for n in nodes:
        front = tomllib.loads(cluster.node_toml(n, nodes, 9000, tmp_path / "logs", "/tmp/hwc/" + n))
        assert front["switch"] == {"max_awake": 2, "host": "127.0.0.1", "port": 9000,
                                   "log_dir": str(tmp_path / "logs"), "socket_dir": "/tmp/hwc/" + n}
        assert "cluster" not in front
        starts[n] = {m["name"]: m.get("start", "eager") for m in front["model"]}
    assert all(s["b"] == "eager" and s["c"] == "eager" for s in starts.values()), "the default and 'all': everywhere"
    assert sorted(s["a"] for s in starts.values()) == ["eager", "lazy", "lazy"], "ready_nodes = 1: one node"
    assert cluster.multiplexed_models() == 2


@pytest.mark.parametrize(("text", "said"), [
    ("[cluster]\nrouter = 'fast'\n[[model]]\nname='a'\n", "router"),
    ("[cluster]\nspred_at = 3\n[[model]]\nname='a'\n", "spred_at"),
    ("[cluster]\nport = '80'\n[[model]]\nname='a'\n", "port"),
    ("[cluster]\n", "no model"),
    ("[[model]]\nname='a'\nready_nodes = 0\n", "ready_nodes"),
])
def test_a_wrong_cluster_table_is_refused_in_one_line_naming_the_key(tmp_path, text, said):
    with pytest.raises(ClusterConfigError, match=said) as err:
        parse(text, tmp_path / "c.toml")
    assert "\n" not in str(err.value)
