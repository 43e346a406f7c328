"""grpo_stream.launch.slurm: a Slurm job's nodes and the sbatch script's parameters as the
hosts of a cluster file (what `up --launcher slurm` places and starts)."""

from __future__ import annotations

import pytest

from grpo_stream.config.cluster import ClusterFile
from grpo_stream.launch.slurm import (
    SlurmError,
    allocation_cluster,
    expand_hostlist,
    layout_from_env,
    placement_override,
)


def _services(cluster: ClusterFile) -> dict[str, dict[str, int]]:
    return {h.name: h.services for h in cluster.hosts}


def _gpus(cluster: ClusterFile) -> dict[str, dict[str, list[int]]]:
    return {h.name: dict(h.gpus) for h in cluster.hosts}


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("solo", ["solo"]),
        ("cl-n[1-3]", ["cl-n1", "cl-n2", "cl-n3"]),
        ("gpu[07,09-10]", ["gpu07", "gpu09", "gpu10"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_the_compressed_node_list_expands_as_scontrol_shows_it(
    nodelist: str, names: list[str]
) -> None:
    assert expand_hostlist(nodelist) == names


def test_hub_trainer_and_scorers_on_node_one_generators_on_the_others() -> None:
    env = {"SLURM_JOB_NODELIST": "node[1-3]", "GENERATORS_PER_NODE": "2", "SCORERS": "2"}
    cluster = allocation_cluster(layout_from_env(env))
    assert _services(cluster) == {
        "node1": {"hub": 1, "trainer": 1, "scorer": 2},
        "node2": {"generator": 2},
        "node3": {"generator": 2},
    }
    assert {h.launcher for h in cluster.hosts} == {"slurm"}
    assert [(h.address, h.bind) for h in cluster.hosts] == [("node1", "0.0.0.0")] + [
        (n, None) for n in ("node2", "node3")
    ]
    assert cluster.hub_port == 5555


def test_trainer_nodes_carry_their_ranks_and_the_scorer_node_only_scorers() -> None:
    env = {
        "SLURM_JOB_NODELIST": "n[1-4]",
        "TRAINER_NODES": "2",
        "TRAINER_GPUS": "4",
        "SCORER_NODE": "3",
        "GENERATORS_PER_NODE": "1",
        "HUB_PORT": "6000",
    }
    cluster = allocation_cluster(layout_from_env(env))
    assert _services(cluster) == {
        "n1": {"hub": 1, "trainer": 4},
        "n2": {"trainer": 4},
        "n3": {"scorer": 2},
        "n4": {"generator": 1},
    }
    assert cluster.hub_port == 6000


def test_without_other_nodes_generators_run_beside_the_trainer_after_its_gpus() -> None:
    env = {"SLURM_JOB_NODELIST": "solo", "GENERATORS_PER_NODE": "3", "SLURM_GPUS_ON_NODE": "8"}
    cluster = allocation_cluster(layout_from_env(env))
    assert _services(cluster) == {"solo": {"hub": 1, "trainer": 1, "scorer": 2, "generator": 3}}
    assert _gpus(cluster) == {"solo": {"trainer": [0], "generator": [1, 2, 3]}}


def test_a_job_with_gpus_places_them_by_hand_and_one_without_places_none() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "GENERATORS_PER_NODE": "8"}
    cpu = layout_from_env(env)
    assert _gpus(allocation_cluster(cpu)) == {"n1": {}, "n2": {}}
    assert placement_override(cpu) == ['run.placement="none"']
    gpu = layout_from_env({**env, "SLURM_GPUS_ON_NODE": "8"})
    assert _gpus(allocation_cluster(gpu)) == {
        "n1": {"trainer": [0]},
        "n2": {"generator": list(range(8))},
    }
    assert placement_override(gpu) == ['run.placement="manual"']


def test_generator_cpus_go_to_srun_on_generator_only_nodes() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "GENERATOR_CPUS": "6"}
    cluster = allocation_cluster(layout_from_env(env))
    assert {h.name: h.env for h in cluster.hosts} == {"n1": {}, "n2": {"SRUN_CPUS_PER_TASK": "6"}}


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {},
            "up --launcher slurm runs inside a Slurm job (sbatch, salloc): "
            "SLURM_JOB_NODELIST is not set",
        ),
        ({"TRAINER_NODES": "3"}, "TRAINER_NODES=3, but the job has 2 node(s)"),
        ({"SCORER_NODE": "0"}, "SCORER_NODE=0: expected a whole number >= 1"),
        ({"GENERATORS_PER_NODE": "two"}, "GENERATORS_PER_NODE=two: expected a whole number >= 1"),
        (
            {"SLURM_GPUS_ON_NODE": "4", "TRAINER_GPUS": "8"},
            "TRAINER_GPUS=8, but the job has 4 GPU(s) per node (SLURM_GPUS_ON_NODE)",
        ),
        (
            {"SLURM_GPUS_ON_NODE": "4", "SCORER_NODE": "2"},
            "GENERATORS_PER_NODE=8 generators of one GPU each beside TRAINER_GPUS=1 need 9 GPUs "
            "per node, but the job has 4 (SLURM_GPUS_ON_NODE)",
        ),
        ({"SLURM_JOB_NODELIST": "n[1-x]"}, "SLURM_JOB_NODELIST: cannot read the range [1-x]"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(env: dict[str, str], says: str) -> None:
    base = {"SLURM_JOB_NODELIST": "n[1-2]"} if env else {}
    with pytest.raises(SlurmError) as caught:
        layout_from_env({**base, **env})
    assert str(caught.value) == says
