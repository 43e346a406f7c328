"""A verifiers 0.4 taskset with no Env of its own: verifiers plays it with SingleAgentEnv
(one reply, scored by the task's @vf.reward). Taskset id `vf_single`."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf


class SingleData(vf.TaskData):
    answer: str


class SingleTask(vf.Task[SingleData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task: SingleData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class SingleTaskset(vf.Taskset[SingleTask, vf.TasksetConfig]):
    def load(self) -> Iterator[SingleTask]:
        for a in range(1, 4):
            yield SingleTask(SingleData(prompt=f"{a}+1=", answer=str(a + 1)), self.config.task)


__all__ = ["SingleTaskset"]


def load_single() -> vf.Env:
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": "vf_single"}))
