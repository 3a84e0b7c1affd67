"""The load test's plan and targets (dtlab/loadtest.py): bad input in one line, before any request; its
latency percentile is a latency some request had. The load test itself runs against the real servers in
tests/trainer/test_serving.py."""

import pytest

from dtlab.errors import DtlabError
from dtlab.loadtest import Target, cluster_targets, percentile
from dtlab.matrix.tasks import LoadPlan


def test_a_plan_reads_its_levels_and_bounds():
    plan = LoadPlan.from_dict({"concurrency": [1, 8, 32], "requests": 64, "timeout_s": 5}, where="serve")
    assert plan == LoadPlan((1, 8, 32), 64, 5.0)
    assert LoadPlan.from_dict({}, where="serve") == LoadPlan()


@pytest.mark.parametrize(("data", "message"), [
    ({"concurrency": []}, "concurrency: must be a list of integers 1-256, got []"),
    ({"concurrency": [0]}, "concurrency: must be a list of integers 1-256, got [0]"),
    ({"concurrency": [True]}, "concurrency: must be a list of integers 1-256, got [True]"),
    ({"concurrency": 8}, "concurrency: must be a list of integers 1-256, got 8"),
    ({"concurrency": [1, 32], "requests": 16},
     "requests: must be an integer from the highest concurrency (32) to 10000, got 16"),
    ({"requests": 10_001},
     "requests: must be an integer from the highest concurrency (32) to 10000, got 10001"),
    ({"timeout_s": 0}, "timeout_s: must be a number of seconds in (0, 600], got 0"),
    ({"rate": 5}, "unknown key rate; use concurrency, requests, timeout_s"),
])
def test_a_bad_plan_is_one_line_naming_the_key(data, message):
    with pytest.raises(DtlabError) as raised:
        LoadPlan.from_dict(data, where="experiments/matrix.yml: serve.load")
    assert str(raised.value) == f"experiments/matrix.yml: serve.load: {message}"


def test_a_load_that_would_leave_the_cluster_is_refused_in_one_line():
    with pytest.raises(DtlabError) as raised:
        cluster_targets(["http://10.0.0.1:8100/predict", "http://192.0.2.7:8100/predict"], {"10.0.0.1"},
                        where="serve")
    assert str(raised.value) == ("serve: 192.0.2.7 is not a cluster node's address (10.0.0.1); "
                                 "a load test stays on the cluster")


@pytest.mark.parametrize("url", ["https://10.0.0.1:8100/predict", "http://10.0.0.1/predict", "10.0.0.1:8100"])
def test_a_target_that_is_not_http_host_port_is_one_line(url):
    with pytest.raises(DtlabError, match=r"^serve: .* is not http://HOST:PORT/PATH$"):
        cluster_targets([url], {"10.0.0.1"}, where="serve")


def test_targets_keep_their_host_port_and_path():
    assert cluster_targets(["http://10.0.0.1:8100/predict"], {"10.0.0.1"}, where="serve") == [
        Target("10.0.0.1", 8100, "/predict")]


def test_the_percentile_is_a_latency_some_request_had():
    latencies = [float(n) for n in range(1, 101)]  # 1..100 ms
    assert percentile(latencies, 50) == 50 and percentile(latencies, 99) == 99
    assert percentile(latencies, 100) == 100 and percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
