"""The step-time model against closed-form FLOP and byte counts (never against timings).

Counts come from :class:`asrfit.memory.steptime.runtime.OpCounter` on real and fake tensors; the
roofline arithmetic of :func:`asrfit.memory.steptime.runtime.step_seconds` is checked on made-up
device rates, where each op's time has a closed form.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.steptime.runtime import OpCounter, StepCost, kernel_counts, op_kind, step_seconds
from asrfit.profiles import host
from asrfit.profiles.gpus.catalog import find_gpu
from asrfit.profiles.host_kernels import KernelCount
from asrfit.profiles.rates import GPU_MATMUL_EFFICIENCY, DeviceRates, gpu_rates

B, D, H, OUT = 4, 256, 512, 128


def _rows(fn) -> list[list]:  # noqa: ANN001
    counter = OpCounter()
    with counter:
        fn()
    return counter.cost().rows


def _cpu_rates(**kw) -> DeviceRates:  # noqa: ANN003
    base = dict(
        name="test cpu",
        matmul_flops_per_second={"fp32": 1e9, "bf16": 5e8},
        conv_flops_per_second={"fp32": 2e8},
        memory_bytes_per_second=1e9,
        kernel_seconds=1e-5,
        forward_kernel_seconds=2e-5,
        threads=1,
    )
    base.update(kw)
    return DeviceRates(**base)


def test_linear_counts_flops_and_bytes_of_addmm() -> None:
    x, w, b = torch.randn(B, D), torch.randn(H, D), torch.randn(H)
    rows = _rows(lambda: F.linear(x, w, b))
    assert len(rows) == 1  # the transpose of w is a view: no kernel
    phase, kind, dtype, flops, nbytes, tensors, count = rows[0]
    assert (kind, dtype, tensors, count) == ("matmul", "fp32", 1, 1)
    assert flops == 2 * B * D * H
    assert nbytes == 4 * (B * D + H * D + H + B * H)


def test_views_run_no_kernel_and_in_place_ops_read_and_write() -> None:
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    assert _rows(lambda: (x.view(32, 64), x.t(), x[1:], x.expand(2, 64, 32))) == []
    rows = _rows(lambda: x.add_(y))
    assert len(rows) == 1 and rows[0][1] == "elementwise"
    assert rows[0][4] == 3 * x.nbytes  # read x and y, write x


def test_reading_a_tensors_elements_in_turn_is_one_read() -> None:
    """``.tolist()`` of a fake tensor reads each element (``_local_scalar_dense``); on a device
    it is one copy to the host. Reads of other storages, or after a kernel, count again."""
    x, y = torch.arange(6), torch.arange(3)

    def calls(fn) -> int:  # noqa: ANN001
        return sum(row[6] for row in _rows(fn))

    assert calls(lambda: [x[i].item() for i in range(6)]) == 1
    assert calls(lambda: (x[0].item(), y[0].item(), x[1].item())) == 3
    assert calls(lambda: (x[0].item(), x.add_(0), x[1].item())) == 3


def test_expanded_input_is_read_once() -> None:
    x, bias = torch.randn(64, 32), torch.randn(32)
    rows = _rows(lambda: x + bias.expand(64, 32))
    assert rows[0][4] == x.nbytes + bias.nbytes + x.nbytes


def test_kinds_of_common_ops() -> None:
    assert op_kind("native_layer_norm_backward") == "norm"
    assert op_kind("_log_softmax") == "softmax"
    assert op_kind("_ctc_loss_backward") == "loss"
    assert op_kind("convolution_backward") == "conv"
    assert op_kind("_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert op_kind("_foreach_mul_") == "optimizer"
    assert op_kind("gelu") == "activation"
    assert op_kind("gelu_backward") == "activation"
    assert op_kind("mul") == "elementwise"
    assert op_kind("sum") == "reduction"


def test_foreach_counts_one_kernel_per_tensor_on_cpu_and_fused_launches_on_gpu() -> None:
    ts = [torch.randn(16) for _ in range(100)]
    rows = _rows(lambda: torch._foreach_mul_(ts, 2.0))
    assert rows[0][5] == 100
    cost = StepCost(rows)
    cpu = _cpu_rates()
    gpu = _cpu_rates(threads=0)
    assert kernel_counts(cost, cpu) == (100, 0) and kernel_counts(cost, gpu) == (3, 0)


def test_roofline_per_op_closed_form() -> None:
    rates = _cpu_rates()
    # compute-bound matmul in backward, memory-bound elementwise in forward
    cost = StepCost(
        [
            ["backward", "matmul", "fp32", 4_000_000, 1000, 1, 2],
            ["forward", "elementwise", "fp32", 0, 8_000_000, 1, 3],
            ["forward", "matmul", "bf16", 1_000_000, 1000, 1, 1],
            ["optimizer", "optimizer", "fp32", 0, 1000, 10, 1],
        ]
    )
    expected = (
        2 * (1e-5 + 4e6 / 1e9)
        + 3 * (2e-5 + 8e6 / 1e9)
        + (2e-5 + 1e6 / 5e8)
        + (10 * 1e-5 + 1000 / 1e9)
    )
    assert step_seconds(cost, rates) == pytest.approx(expected)


def test_memory_bound_ops_use_their_kinds_bandwidth() -> None:
    rates = _cpu_rates(kind_bytes_per_second={"norm": 2.5e8})
    norm = StepCost([["backward", "norm", "fp32", 0, 10**6, 1, 1]])
    add = StepCost([["backward", "elementwise", "fp32", 0, 10**6, 1, 1]])
    assert step_seconds(norm, rates) == pytest.approx(1e-5 + 10**6 / 2.5e8)
    assert step_seconds(add, rates) == pytest.approx(1e-5 + 10**6 / 1e9)


def test_cpu_fixed_costs_by_kind_module_and_optimizer_closed_form() -> None:
    rates = _cpu_rates(
        kernel_seconds_by_kind={"conv": [4e-5, 5e-5]},
        module_seconds=6e-5,
        optimizer_kernel_seconds=2e-6,
        attention_flops_per_second={"fp32": 2e8},
    )
    cost = StepCost(
        [
            ["forward", "conv", "fp32", 0, 0, 1, 2],  # the conv's forward fixed cost
            ["backward", "conv", "fp32", 0, 0, 1, 1],  # its backward one
            ["forward", "module", "fp32", 0, 0, 0, 3],  # 3 module calls, no kernel
            ["optimizer", "optimizer", "fp32", 0, 0, 10, 1],  # 10 tensors: 10 kernels
            ["forward", "attention", "fp32", 10**6, 0, 1, 1],  # at the attention rate
        ]
    )
    expected = 2 * 4e-5 + 5e-5 + 3 * 6e-5 + 10 * 2e-6 + (2e-5 + 10**6 / 2e8)
    assert step_seconds(cost, rates) == pytest.approx(expected)
    assert cost.calls == 2 + 1 + 1 + 1 and cost.module_calls == 3


def test_rate_curves_interpolate_log_log_and_stay_flat_beyond_the_ends() -> None:
    from asrfit.profiles.rates import BANDWIDTH_BYTES

    rates = _cpu_rates(
        rate_curves={
            "matmul": {"fp32": [[10.0, 1e9], [1000.0, 1e11]]},
            "bandwidth": {"fp32": [[1e6, 4e9], [BANDWIDTH_BYTES, 2e9], [1e12, 2e9]]},
        }
    )
    assert rates.matmul_rate("fp32", 100.0) == pytest.approx(1e10)  # halfway in log-log
    assert rates.matmul_rate("fp32", 1.0) == pytest.approx(1e9)
    assert rates.matmul_rate("fp32", 1e6) == pytest.approx(1e11)
    assert rates.matmul_rate("fp32") == 1e9  # no intensity: the single figure
    assert rates.conv_rate("fp32", 100.0) == 2e8  # no conv curve: the single figure
    # the measured bandwidth (1e9 here) scaled by curve(bytes) / curve(reference bytes)
    assert rates.bandwidth("elementwise", 1e6) == pytest.approx(2e9)
    assert rates.bandwidth("elementwise", BANDWIDTH_BYTES) == pytest.approx(1e9)
    row = ["forward", "matmul", "fp32", 10**8, 10**6, 1, 1]  # 100 FLOPs per byte
    assert step_seconds(StepCost([row]), rates) == pytest.approx(2e-5 + 10**8 / 1e10)


def test_a_kind_with_its_own_bandwidth_curve_is_not_scaled_by_adds() -> None:
    # add streams 4x faster in cache (1 MB) than at the reference size; a dropout mask's
    # generator does not: its own curve is flat, and it is read as measured
    from asrfit.profiles.rates import BANDWIDTH_BYTES

    rates = _cpu_rates(
        kind_bytes_per_second={"random": 1e9, "norm": 5e9},
        rate_curves={
            "bandwidth": {"fp32": [[1e6, 8e9], [BANDWIDTH_BYTES, 2e9]]},
            "bandwidth:random": {"fp32": [[1e6, 1.1e9], [BANDWIDTH_BYTES, 1e9]]},
        },
    )
    assert rates.bandwidth("random", 1e6) == pytest.approx(1.1e9)
    assert rates.bandwidth("random", 1e12) == pytest.approx(1e9)  # flat beyond the ends
    assert rates.bandwidth("random") == 1e9  # no size: the single figure
    assert rates.bandwidth("norm", 1e6) == pytest.approx(5e9 * 4)  # no own curve: add's ratio


def test_module_calls_are_counted_once_per_call() -> None:
    model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, OUT))
    x = torch.randn(B, D)
    counter = OpCounter()
    with counter:
        model(x)
        model[0](x)
    # the Sequential and its three children, then one Linear alone
    assert counter.cost().module_calls == 5


def test_gpu_step_is_host_time_plus_device_time() -> None:
    rates = _cpu_rates(threads=0, launch_seconds=3e-6)  # asynchronous
    tiny = StepCost([["forward", "elementwise", "fp32", 0, 100, 1, 1000]])
    # device: 1000 x (3e-6 per kernel + 1e-7 of traffic); host: 1000 x 2e-5 forward cost
    assert step_seconds(tiny, rates) == pytest.approx(1000 * (3e-6 + 1e-7) + 1000 * 2e-5)
    big = StepCost([["forward", "matmul", "fp32", 10**9, 100, 1, 1]])
    assert step_seconds(big, rates) == pytest.approx(3e-6 + 1.0 + 2e-5)
    # without a launch figure the device's per-kernel time is kernel_seconds
    assert step_seconds(big, _cpu_rates(threads=0)) == pytest.approx(1e-5 + 1.0 + 2e-5)


def _mlp_adapter() -> StepAdapter:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, OUT, bias=False))

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(shape.batch_size, D)}

    def loss(model: nn.Module, kw: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(kw["x"]).sum()

    return StepAdapter("mlp", build, make_inputs, loss)


def test_traced_step_matmul_flops_match_closed_form() -> None:
    r = simulate_step(_mlp_adapter(), BatchShape(B, D, 1), Setup(optimizer="sgd"), target="cpu")
    matmul = [row for row in r.cost.rows if row[1] == "matmul"]
    forward = sum(row[3] * row[6] for row in matmul if row[0] == "forward")
    backward = sum(row[3] * row[6] for row in matmul if row[0] == "backward")
    assert forward == 2 * B * D * H + 2 * B * H * OUT
    # layer 2: grad input + grad weight; layer 1: grad weight only (x needs no grad)
    assert backward == 2 * B * H * OUT * 2 + 2 * B * D * H
    # SGD with momentum: foreach ops over the two weights, in the optimizer phase only
    opt = [row for row in r.cost.rows if row[0] == "optimizer"]
    assert opt and all(row[1] == "optimizer" for row in opt)
    assert any(row[5] == 2 for row in opt)
    assert not any(row[0] == "inputs" for row in r.cost.rows)
    # the cost survives the simulation cache's JSON round trip
    again = type(r).from_dict(json.loads(json.dumps(r.to_dict())))
    assert again.cost.rows == r.cost.rows


def test_gpu_rates_come_from_the_catalog() -> None:
    spec = find_gpu("L4")
    rates = gpu_rates(spec)
    assert rates.matmul_rate("bf16") == pytest.approx(
        spec.bf16_tflops * 1e12 * GPU_MATMUL_EFFICIENCY
    )
    assert rates.memory_bytes_per_second < spec.memory_bandwidth_bytes_per_second
    assert rates.asynchronous and spec.source.url in rates.sources[0]
    # PyTorch's defaults: fp32 matmuls without tf32 (CUDA cores), fp32 convolutions with it
    assert rates.matmul_rate("fp32") == pytest.approx(
        spec.fp32_tflops * 1e12 * GPU_MATMUL_EFFICIENCY
    )
    assert rates.conv_rate("fp32") == pytest.approx(spec.tf32_tflops * 1e12 * GPU_MATMUL_EFFICIENCY)


def test_device_rates_reject_bad_figures() -> None:
    with pytest.raises(ConfigError, match="fp32"):
        _cpu_rates(matmul_flops_per_second={"bf16": 1e9})
    with pytest.raises(ConfigError, match="memory_bytes_per_second"):
        _cpu_rates(memory_bytes_per_second=0)


def test_host_rates_are_cached_per_machine(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_measure(threads: int) -> DeviceRates:
        calls.append(threads)
        return _cpu_rates(threads=threads)

    monkeypatch.setattr(host, "measure_host_rates", fake_measure)
    # a quiet machine (rates measured under load are not cached: another test's subject)
    monkeypatch.setattr(host, "other_runnable", lambda: 0)
    host.host_rates.cache_clear()
    first = host.host_rates(3)
    host.host_rates.cache_clear()
    second = host.host_rates(3)  # read from disk, not measured again
    host.host_rates.cache_clear()
    assert calls == [3] and first == second
    assert list((tmp_path / "host").glob("*.json"))


def test_loader_workers_meet_training_with_margin() -> None:
    from asrfit.plan.speed import loader_workers

    # 1000 audio s/s to train, 300 per worker: ceil(1.25 * 1000 / 300) = 5 workers
    assert loader_workers(1000.0, 300.0, 8) == (5, False)
    # only 2 workers allowed: 600 < 1000, loading bounds the step
    assert loader_workers(1000.0, 300.0, 2) == (2, True)
    assert loader_workers(10.0, 300.0, 8) == (1, False)
    with pytest.raises(ValueError, match="worker_audio_seconds_per_second"):
        loader_workers(10.0, 0.0, 8)


def test_loader_rate_is_audio_over_decode_plus_features(tmp_path) -> None:  # noqa: ANN001
    import numpy as np
    import soundfile as sf

    from asrfit.data.throughput import measure_loader_rate

    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(16000 * 2, dtype=np.float32), 16000)
    rate = measure_loader_rate([path], repeats=1)
    per_audio_second = rate.decode_seconds_per_audio_second + rate.features_seconds_per_audio_second
    assert rate.files == 1
    assert rate.audio_seconds_per_second == pytest.approx(1.0 / per_audio_second)


def test_planner_step_time_fit_reproduces_the_roofline_at_traced_shapes() -> None:
    from asrfit.memory.fit.costmodel import fit_peak_model  # noqa: F401  (the fit used inside)
    from asrfit.plan.setup_costs import SetupCosts
    from asrfit.plan.speed import predict_step_seconds

    rates = _cpu_rates()
    # kernels proportional to B*T (one elementwise op of B*T*4 bytes) plus a fixed op
    points = []
    for b, t in ((1, 100), (2, 100), (1, 400), (4, 400)):
        cost = StepCost(
            [
                ["forward", "elementwise", "fp32", 0, 4 * b * t * 1000, 1, 1],
                ["backward", "elementwise", "fp32", 0, 1000, 1, 1],
            ]
        )
        points.append((b, t, 1, cost))
    opt = StepCost([["optimizer", "optimizer", "fp32", 0, 0, 4, 1]])
    costs = SetupCosts(Setup(), None, 0, 0, 0, None, time_points=points, optimizer_cost=opt)
    for b, t, _, cost in points:
        expected = step_seconds(cost, rates) + step_seconds(opt, rates)
        assert predict_step_seconds(costs, rates, b, t, 1) == pytest.approx(expected, rel=1e-3)


def test_simulate_on_cpu_reports_step_seconds_and_audio_rate(monkeypatch) -> None:  # noqa: ANN001
    import asrfit.memory.report as report_module

    rates = _cpu_rates()
    monkeypatch.setattr(report_module, "host_rates", lambda *a, **k: rates)
    report = report_module.simulate(
        _mlp_adapter(), batch_size=B, seconds=2.0, label_length=1, gpu="cpu"
    )
    assert report.step.target == "cpu" and report.gpu is None
    assert report.step_seconds == pytest.approx(step_seconds(report.step.cost, rates))
    assert report.audio_seconds_per_second == pytest.approx(B * 2.0 / report.step_seconds)
    assert sum(report.step_seconds_by_kind.values()) == pytest.approx(report.step_seconds)
    no_device = report_module.simulate(_mlp_adapter(), batch_size=B, seconds=2.0, label_length=1)
    assert no_device.step_seconds is None


@pytest.mark.parametrize("arch", ["whisper", "wav2vec2", "parakeet-ctc"])
def test_traced_step_runs_as_many_kernels_as_the_real_step(arch: str, one_thread) -> None:  # noqa: ANN001
    """Forward and backward kernel counts of the fake-tensor trace equal those of the real
    step, counted op by op on real tensors (queries such as ``prim::device``, which a fake
    tensor answers through the dispatcher, are not kernels)."""
    from asrfit.memory.models.adapters import hf_adapter
    from bench import _grid

    case = _grid.Case(arch, "fp32", False, "sgd", 2, 1.0, 6)
    sim = simulate_step(hf_adapter(case.config()), case.batch, case.setup, target="cpu")
    model = _grid.build_real_model(case)
    inputs = _grid.make_real_inputs(case, model.config)
    forward, backward = KernelCount(), KernelCount()
    with forward.mode:
        loss = model(**inputs).loss
    with backward.mode:
        loss.backward()
    implicit = _implicit_copies(model, inputs)
    # within 5 %: under a dispatch mode autograd clones some gradients that a plain step
    # hands over (measured: 1 of 11 backward clones in wav2vec2, 7 of 17 in parakeet-ctc),
    # and fake .item() calls differ by a few; before the prim::device fix the trace
    # counted 4-10x the real kernels. The copies kernels make of non-contiguous inputs
    # themselves (below the dispatcher: no dispatch mode sees them) are counted from the
    # profiler.
    real_forward = forward.kernels + implicit["forward"]
    real_backward = backward.kernels + implicit["backward"]
    assert sim.cost.select(("forward",)).calls == pytest.approx(real_forward, rel=0.05)
    assert sim.cost.select(("backward",)).calls == pytest.approx(real_backward, rel=0.05)


def _implicit_copies(model, inputs) -> dict[str, int]:  # noqa: ANN001
    """``aten::copy_`` calls that kernels make themselves (under an ``aten::contiguous``
    called by another aten op), forward and backward, in one real step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("asrfit_forward"):
            loss = model(**inputs).loss
        with record_function("asrfit_backward"):
            loss.backward()
    counts = {"forward": 0, "backward": 0}
    for event in prof.events():
        parent = event.cpu_parent
        if event.name != "aten::clone" or parent is None or parent.name != "aten::contiguous":
            continue
        caller = parent.cpu_parent
        if caller is None or not caller.name.startswith("aten::"):
            continue  # a .contiguous() the model's Python code calls: dispatched, traced
        while caller.cpu_parent is not None:
            caller = caller.cpu_parent
        counts["backward" if caller.name == "asrfit_backward" else "forward"] += 1
    return counts


def test_a_disturbed_module_call_measurement_is_taken_again(monkeypatch) -> None:  # noqa: ANN001
    from asrfit.profiles import host_kernels

    # each `both` is two best_seconds calls (backward, then forward); rounds alternate
    # wrapped and bare. First attempt: the bare side disturbed (slower than wrapped).
    per_attempt = 2 * 2 * host_kernels._MODULE_ROUNDS
    wrapped_fast, bare_slow = [1e-5, 1e-5], [2e-5, 2e-5]
    first = (wrapped_fast + bare_slow) * host_kernels._MODULE_ROUNDS
    second = ([3e-5, 3e-5] + [1e-5, 1e-5]) * host_kernels._MODULE_ROUNDS
    times = iter(first + second)
    monkeypatch.setattr(host_kernels, "best_seconds", lambda *a, **k: next(times))
    measured = host_kernels.module_call_seconds()
    assert len(first) == len(second) == per_attempt
    # second attempt: (6e-5 - 2e-5) over a chain of CHAIN calls
    assert measured == pytest.approx(4e-5 / host_kernels.CHAIN)


def test_a_module_call_never_measured_above_a_bare_op_is_an_error(monkeypatch) -> None:  # noqa: ANN001
    from asrfit.profiles import host_kernels

    monkeypatch.setattr(host_kernels, "best_seconds", lambda *a, **k: 1e-5)  # no difference
    with pytest.raises(RuntimeError, match="too busy to measure"):
        host_kernels.module_call_seconds()


def test_integer_index_arithmetic_costs_its_own_figure() -> None:
    """Integer-only ops are keyed "int" and priced at int_kernel_seconds in forward."""
    index = torch.arange(24)
    x = torch.randn(24, requires_grad=True)

    def step() -> None:
        valid = (index - 2) >= 0  # two integer / bool kernels
        y = torch.where(valid, x, 0.0)  # reads a float: a float kernel
        y.sum().backward()

    rows = _rows(step)
    assert sum(r[6] for r in rows if r[2] == "int") == 2
    assert all(r[0] == "forward" for r in rows if r[2] == "int")
    # closed form: forward integer kernels at their figure, not at the float kernel's;
    # rates without the figure fall back to the kind's
    cost = StepCost([["forward", "elementwise", "int", 0, 0, 1, 5]])
    assert step_seconds(cost, _cpu_rates(int_kernel_seconds=3e-6)) == pytest.approx(5 * 3e-6)
    assert step_seconds(cost, _cpu_rates()) == pytest.approx(5 * 2e-5)


def test_a_cpu_attention_row_carries_its_shape_forward_and_backward() -> None:
    # batch 3, 2 heads, 5 queries over 7 keys, head dim 4: the shape is read off q and k
    q = torch.randn(3, 2, 5, 4, requires_grad=True)
    k, v = torch.randn(3, 2, 7, 4, requires_grad=True), torch.randn(3, 2, 7, 4)
    counter = OpCounter()
    with counter:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    rows = [r for r in counter.cost().rows if r[1] == "attention"]
    assert sorted(r[7] for r in rows) == [[6, 5, 7, 4, 0], [6, 5, 7, 4, 1]]
    forward = next(r for r in rows if r[7][4] == 0)
    assert forward[3] == 4 * 3 * 2 * 5 * 7 * 4  # 4 B H L S D
    assert all(len(r) == 7 for r in counter.cost().rows if r[1] != "attention")


def test_attention_calls_are_priced_at_their_shape() -> None:
    # forward seconds of 8 heads: 1 ms at length 16 and 4 ms at 64 (dim 16), twice at dim 64
    table = {
        "forward": [[16.0, 16.0, 1e-3], [64.0, 16.0, 4e-3], [16.0, 64.0, 2e-3], [64.0, 64.0, 8e-3]],
        "backward": [
            [16.0, 16.0, 3e-3],
            [64.0, 16.0, 6e-3],
            [16.0, 64.0, 3e-3],
            [64.0, 64.0, 6e-3],
        ],
    }
    rates = _cpu_rates(attention_seconds={"bf16": table})
    price = rates.attention_call_seconds
    assert price("bf16", [8, 16, 16, 16, 0]) == pytest.approx(1e-3)
    assert price("bf16", [8, 32, 32, 16, 0]) == pytest.approx(2e-3)  # log-log in length
    assert price("bf16", [16, 64, 64, 16, 0]) == pytest.approx(8e-3)  # twice the heads
    assert price("bf16", [8, 16, 64, 16, 0]) == pytest.approx(2e-3)  # at sqrt(L S)
    assert price("bf16", [8, 128, 128, 16, 0]) == pytest.approx(16e-3)  # L^2 beyond
    assert price("bf16", [8, 16, 16, 128, 0]) == pytest.approx(4e-3)  # D above: proportional
    assert price("bf16", [8, 16, 16, 32, 1]) == pytest.approx(3e-3)
    assert rates.attention_call_seconds("fp32", [8, 16, 16, 16, 0]) is None  # not measured
    fixed = rates.fixed_seconds("forward", "attention", "bf16")
    row = ["forward", "attention", "bf16", 10**6, 10**4, 1, 2, [8, 16, 16, 16, 0]]
    assert step_seconds(StepCost([row]), rates) == pytest.approx(2 * (fixed + (1e-3 - fixed)))
