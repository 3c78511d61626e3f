"""How a plan runs its data side: streaming or caching, long utterances, loader workers.

Each decision comes with its reason (:class:`asrfit.plan.plan.DataDecisions`). The loader
workers found here are a ceiling from the host (CPUs, RAM); the search then lowers them to
what keeps up with training at the measured decoding rate
(:func:`asrfit.plan.speed.loader_workers`).

Training on the CPU with the decoded inputs cached takes no worker. The cache lives in the
process that loads: the training process keeps it across epochs, while a worker's copy goes
with the worker at each epoch's end, so a worker decodes and featurises every utterance again
every epoch, on the cores the training threads use. Measured with the speech demo's recipe
(conformer-ctc-small, 2 epochs, 2 cores, two pairs of runs; `docs/history.md`, "Loader
workers when training on the CPU"): the second epoch took 80.1 and 74.6 s with none against
94.0 and 90.8 s with one worker; the first epochs, which decode either way, 77.5-83.2 s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asrfit.plan.plan import DataDecisions

WORKER_HOST_BYTES = 2 << 30  # host RAM a decoding data-loader worker may use
GIB = 2**30


def data_decisions(
    dataset: Any, hardware: Any, world_size: int, long_utterances: str, max_seconds: float
) -> DataDecisions:
    """Streaming, caching, long utterances and the ceiling on loader workers, with reasons.

    Args:
        dataset: A :class:`~asrfit.profiles.dataset.DatasetProfile`.
        hardware: A :class:`~asrfit.profiles.hardware.HardwareProfile` ("cpu-only": training
            runs on this CPU).
        world_size: Training processes.
        long_utterances: "chunk" or "filter" for utterances above ``max_seconds``.
        max_seconds: The largest bucket's edge.
    """
    durations = np.asarray(
        dataset.duration_sample_seconds or [dataset.duration_max_seconds], dtype=float
    )
    long_fraction = float((durations > max_seconds).mean())
    decoded = int(dataset.estimated_decoded_bytes)
    host = int(hardware.host_available_bytes)
    reasons = []
    cache = decoded <= 0.3 * host
    streaming = decoded > 0.8 * host
    if cache:
        reasons.append(
            f"cache decoded audio: {decoded / GIB:.2f} GiB is under 30% of {host / GIB:.1f} GiB host RAM"
        )
    elif streaming:
        reasons.append(
            f"stream: decoded audio {decoded / GIB:.1f} GiB exceeds 80% of host RAM {host / GIB:.1f} GiB"
        )
    else:
        reasons.append(
            f"no cache: decoded audio {decoded / GIB:.1f} GiB is a large share of host RAM"
        )
    if cache and hardware.source == "cpu-only":
        workers = 0
        reasons.append(
            "0 loader workers: training runs on this CPU and the decoded inputs are cached, so "
            "the training process loads each utterance once and keeps it (a worker would "
            "decode every epoch again, on the cores training uses)"
        )
    else:
        cpus_per_process = max(1, hardware.cpu_count // max(1, world_size))
        by_ram = int(host // (WORKER_HOST_BYTES * max(1, world_size)))
        workers = max(0, min(cpus_per_process - 1, 8, by_ram))
        reasons.append(
            f"{workers} loader workers: {hardware.cpu_count} CPUs for {world_size} "
            "process(es), ~2 GiB RAM each"
        )
    if long_fraction > 0:
        reasons.append(
            f"{long_utterances} {long_fraction:.1%} of utterances longer than {max_seconds:g} s"
        )
    return DataDecisions(
        streaming=streaming,
        cache_decoded_audio=cache,
        long_utterances=long_utterances,
        max_seconds=max_seconds,
        long_utterance_fraction=long_fraction,
        num_workers=workers,
        reasons=reasons,
    )


HOST_BUFFER_FACTOR = 1.5
"""Host memory beyond the offloaded states themselves (pinned transfer buffers, the CPU
optimizer's work space), as DeepSpeed's own estimators (``estimate_zero2_model_states_mem_needs``
and ``estimate_zero3_model_states_mem_needs``, their ``additional_buffer_factor``) count it."""


def offload_host_bytes(offloaded_bytes: int, processes_per_node: int) -> int:
    """Host memory one node needs for what CPU offload moves off its GPUs.

    Args:
        offloaded_bytes: Model states offload keeps on the host, per process
            (:attr:`asrfit.plan.costs.SetupCosts.offloaded_bytes`).
        processes_per_node: Training processes (GPUs) on the node.
    """
    return int(offloaded_bytes * processes_per_node * HOST_BUFFER_FACTOR)


def offload_warnings(offloaded_bytes: int, processes_per_node: int, hardware: Any) -> list[str]:
    """A warning when offloaded model states would fill more than 80 % of the host's free RAM.

    The planner counts the GPU's memory; offload moves the optimizer state (and in ZeRO-3 the
    parameters) into host RAM, where a node short of it swaps or is killed. For a catalog GPU
    the host figures are this machine's, not the training host's.
    """
    need = offload_host_bytes(offloaded_bytes, processes_per_node)
    host = int(hardware.host_available_bytes)
    if need <= 0 or need <= 0.8 * host:
        return []
    whose = (
        "this machine"
        if hardware.source == "detected"
        else "this machine (not the GPU's host: check there)"
    )
    return [
        f"CPU offload keeps about {need / GIB:.1f} GiB of model states in host RAM per node "
        f"({processes_per_node} process(es), x{HOST_BUFFER_FACTOR:g} for buffers as DeepSpeed "
        f"estimates), over 80 % of the {host / GIB:.1f} GiB free on {whose}: the host may swap "
        "or kill training. Use a host with more RAM, more GPUs, or a smaller model."
    ]
