"""A cluster Determined cell waits for its experiment through the master, bounded by the cell timeout.
No master runs here, so a stand-in for the det SDK's client answers; the context staged is real."""

from __future__ import annotations

import pytest

from dtlab.errors import DtlabError
from dtlab.platforms import determined
from dtlab.platforms.determined import master as detmaster


class StandInExperiment:
    """The det SDK's Experiment as the harness uses it: a cached state that reload() refreshes."""

    id = 7

    def __init__(self, states: list[str]):
        self.states, self.state, self.reloads, self.killed = list(states), "STATE_QUEUED", 0, False

    def reload(self) -> None:
        self.reloads += 1
        self.state = self.states.pop(0) if self.states else self.state

    def kill(self) -> None:
        self.killed = True

    def list_trials(self):
        return [StandInTrial()]


class StandInTrial:
    id = 70

    def iter_metrics(self, group: str):
        return iter([type("Metrics", (), {"metrics": {"val_accuracy": 0.5}})()])


@pytest.fixture
def experiment_on(monkeypatch, cpu_cluster):
    def start(states: list[str], timeout_s: int) -> tuple[determined.ClusterExperiment, StandInExperiment]:
        experiment = StandInExperiment(states)
        client = type("Client", (), {"create_experiment": lambda self, config, model_dir: experiment})()
        monkeypatch.setattr(detmaster, "connect", lambda cluster: client)
        monkeypatch.setattr(determined, "POLL_S", 0.01)
        return determined.ClusterExperiment(cpu_cluster, None, {}, timeout_s), experiment

    return start


def test_the_wait_ends_at_the_first_final_state_the_master_reports(experiment_on):
    cell_experiment, experiment = experiment_on(["STATE_ACTIVE", "STATE_ACTIVE", "STATE_COMPLETED"], 60)
    outcome = cell_experiment.run()
    assert outcome == {"experiment_id": 7, "state": "STATE_COMPLETED", "trial_id": 70,
                       "master_validation_metrics": [{"val_accuracy": 0.5}]}
    assert experiment.reloads == 3 and not experiment.killed


def test_an_experiment_still_running_at_the_cell_timeout_is_killed_and_named(experiment_on):
    cell_experiment, experiment = experiment_on(["STATE_ACTIVE"], 0)
    with pytest.raises(DtlabError, match=r"^determined experiment 7: not done after 0 s; killed$"):
        cell_experiment.run()
    assert experiment.killed
