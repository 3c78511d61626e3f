"""HardwareProfile and the GPU catalog: name lookup, margins, usable bytes, JSON, detection."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asrfit.errors import ConfigError, UnknownGPUError
from asrfit.profiles.gpus import catalog as catalog_mod
from asrfit.profiles.gpus import probe
from asrfit.profiles.hardware import (
    GPUSpec,
    HardwareProfile,
    find_gpu,
    host_memory_bytes,
    list_gpus,
)

GiB = 1024**3
MiB = 1024**2


# ------------------------------------------------------------------ name lookup


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("t4", "T4"),
        ("T4", "T4"),
        ("Tesla T4", "T4"),
        ("a100 80gb", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("a100-80g", "A100-80GB"),
        ("A100 80 GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("rtx4090", "RTX-4090"),
        ("RTX 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("h100 pcie", "H100-PCIe"),
        ("H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("v100 16gb", "V100-16GB"),
        ("p100", "P100-16GB"),
        ("l4", "L4"),
        ("L40", "L40"),
        ("l40s", "L40S"),
        ("a10", "A10"),
        ("A10G", "A10G"),
        ("rtx a6000", "RTX-A6000"),
        ("RTX 6000 Ada", "RTX-6000-Ada"),
        ("rtx 4060 ti 16gb", "RTX-4060-Ti-16GB"),
    ],
)
def test_loose_name_matching(typed: str, canonical: str) -> None:
    assert find_gpu(typed).name == canonical
    assert HardwareProfile.from_name(typed).spec.name == canonical


@pytest.mark.parametrize(
    ("family", "default", "alternative"),
    [
        ("A100", "A100-40GB", "A100-80GB"),
        ("h100", "H100-80GB", "H100-PCIe"),
        ("V100", "V100-16GB", "V100-32GB"),
    ],
)
def test_family_name_resolves_to_documented_default_and_warns(
    family: str, default: str, alternative: str
) -> None:
    with pytest.warns(UserWarning, match=re.escape(alternative)):
        profile = HardwareProfile.from_name(family)
    assert profile.spec.name == default
    assert any(alternative in note for note in profile.notes)


_ALIASES = [(alias, spec.name) for spec in list_gpus() for alias in (spec.name, *spec.aliases)]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_lookup_ignores_case_and_separators(data: st.DataObject) -> None:
    alias, canonical = data.draw(st.sampled_from(_ALIASES))
    words = re.split(r"[\s_\-]+", alias)
    seps = data.draw(
        st.lists(
            st.sampled_from([" ", "-", "_", " - ", "__"]), min_size=len(words), max_size=len(words)
        )
    )
    spelled = "".join(w + s for w, s in zip(words, seps, strict=True)).strip(" -_")
    flips = data.draw(st.lists(st.booleans(), min_size=len(spelled), max_size=len(spelled)))
    spelled = "".join(c.swapcase() if f else c for c, f in zip(spelled, flips, strict=True))
    if data.draw(st.booleans()):
        spelled = "NVIDIA " + spelled
    assert find_gpu(spelled).name == canonical


def test_unknown_name_lists_close_matches_and_how_to_list_all() -> None:
    with pytest.raises(UnknownGPUError) as info:
        HardwareProfile.from_name("A100-50GB")
    message = str(info.value)
    assert "'A100-50GB'" in message
    assert "A100-40GB" in message and "A100-80GB" in message
    assert "asrfit gpus" in message and "list_gpus()" in message
    assert isinstance(info.value, KeyError)  # callers catching KeyError keep working


def test_unknown_name_without_close_match_still_says_how_to_list() -> None:
    with pytest.raises(UnknownGPUError, match="asrfit gpus"):
        find_gpu("zzqx")
    with pytest.raises(UnknownGPUError, match="empty"):
        find_gpu("  ")


def test_find_gpu_returns_copies() -> None:
    spec = find_gpu("L4")
    spec.memory_bytes = 1
    spec.aliases.append("mine")
    again = find_gpu("L4")
    assert again.memory_bytes == 24 * GiB and "mine" not in again.aliases


# ------------------------------------------------------------------ catalog content

REQUIRED = [
    "T4", "L4", "A10G", "A10", "A40", "L40S", "V100-16GB", "V100-32GB", "A100-40GB",
    "A100-80GB", "H100-80GB", "H100-PCIe", "H200", "RTX-3090", "RTX-4090",
    "RTX-4060-Ti-16GB", "RTX-A6000", "RTX-6000-Ada", "P100-16GB",
]  # fmt: skip


def test_catalog_has_required_gpus() -> None:
    names = {spec.name for spec in list_gpus()}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("spec", list_gpus(), ids=lambda s: s.name)
def test_every_catalog_entry_is_consistent(spec: GPUSpec) -> None:
    # nominal capacities are whole GiB; a capacity CUDA reported on a real board (the
    # entry's notes say so) is the reported byte count
    measured = "CUDA reports as the board's total" in spec.notes
    assert spec.memory_bytes > 0 and (measured or spec.memory_bytes % GiB == 0)
    assert spec.fp32_tflops > 0 and spec.fp16_tflops >= spec.fp32_tflops
    assert spec.memory_bandwidth_bytes_per_second > 0
    assert spec.source.title.strip() and spec.source.url.startswith("https://")
    major = int(spec.compute_capability.split(".")[0])
    assert spec.supports_bf16 == (major >= 8)
    assert (spec.bf16_tflops is not None) == spec.supports_bf16
    assert (spec.tf32_tflops is not None) == spec.supports_bf16  # tf32 came with Ampere too


def test_catalog_spot_checks_against_datasheets() -> None:
    # Dense figures typed from NVIDIA datasheets, not from the catalog.
    a100 = find_gpu("A100-80GB")
    assert (a100.bf16_tflops, a100.fp32_tflops, a100.memory_bandwidth_bytes_per_second) == (
        312.0,
        19.5,
        2039 * 10**9,
    )
    h100 = find_gpu("H100-80GB")
    assert h100.bf16_tflops == pytest.approx(989, abs=1) and h100.fp32_tflops == 67.0
    assert h100.memory_bandwidth_bytes_per_second == 3350 * 10**9
    l4 = find_gpu("L4")
    assert (l4.bf16_tflops, l4.fp32_tflops, l4.memory_bandwidth_bytes_per_second) == (
        121.0,
        30.3,
        300 * 10**9,
    )
    t4 = find_gpu("T4")
    assert (t4.fp16_tflops, t4.fp32_tflops, t4.bf16_tflops) == (65.0, 8.1, None)
    assert t4.memory_bandwidth_bytes_per_second == 320 * 10**9 and t4.memory_bytes == 16 * GiB


def test_catalog_file_documents_conventions() -> None:
    path = Path(catalog_mod.__file__).with_name("catalog.json")
    data = json.loads(path.read_text())
    text = " ".join(data["notes"]).lower()
    assert "dense" in text and "sparsity" in text and "sxm" in text


def test_spec_validation_rejects_bf16_on_turing() -> None:
    entry = find_gpu("T4").to_dict()
    entry["supports_bf16"] = True
    with pytest.raises(ConfigError, match="compute capability 7.5"):
        GPUSpec.from_dict(entry)


# ------------------------------------------------------------------ margin, usable bytes


@pytest.mark.parametrize("margin", [0.4, 0.99, 1.5])
def test_margin_out_of_range_is_rejected_naming_range(margin: float) -> None:
    with pytest.raises(ConfigError) as info:
        HardwareProfile.from_name("L4", safety_margin=margin)
    message = str(info.value)
    assert str(margin) in message and "0.5" in message and "0.98" in message


@pytest.mark.parametrize("margin", [0.5, 0.98])
def test_margin_at_range_ends_is_accepted(margin: float) -> None:
    assert HardwareProfile.from_name("L4", safety_margin=margin).safety_margin == margin


def test_margin_must_be_a_number() -> None:
    with pytest.raises(ConfigError, match="number"):
        HardwareProfile.from_name("L4", safety_margin="high")  # type: ignore[arg-type]


def test_usable_bytes_l4() -> None:
    profile = HardwareProfile.from_name("L4", safety_margin=0.85, num_gpus=2)
    # 24 GiB of GDDR6 with ECC on: CUDA sees 15/16 of it = 22.5 GiB = 24_159_191_040 bytes;
    # x 0.85 = 20_535_312_384 bytes.
    assert profile.gpu_memory_bytes == 24_159_191_040
    assert profile.usable_bytes == 20_535_312_384
    assert profile.num_gpus == 2 and profile.source == "catalog"
    assert profile.peak_tflops("BF16") == 121.0 and profile.supports_bf16


def test_usable_bytes_hbm_card_has_no_ecc_reserve() -> None:
    profile = HardwareProfile.from_name("A100-80GB", safety_margin=0.9)
    assert profile.usable_bytes == 77_309_411_328  # 80 * 2**30 * 0.9


def test_peak_tflops_precisions() -> None:
    t4 = HardwareProfile.from_name("T4")
    assert t4.peak_tflops("bf16") is None and t4.peak_tflops("fp16") == 65.0
    assert not t4.supports_bf16
    assert t4.memory_bandwidth_bytes_per_second == 320 * 10**9
    with pytest.raises(ConfigError, match="fp8"):
        t4.peak_tflops("fp8")


def test_num_gpus_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="num_gpus"):
        HardwareProfile.from_name("L4", num_gpus=0)


# ------------------------------------------------------------------ JSON


def test_json_round_trip(tmp_path: Path) -> None:
    profile = HardwareProfile.from_name("RTX 4090", safety_margin=0.9, num_gpus=2)
    path = profile.save(tmp_path / "hw.json")
    loaded = HardwareProfile.load(path)
    assert loaded == profile
    assert HardwareProfile.from_json(profile.to_json()) == profile
    assert json.loads(path.read_text())["spec"]["name"] == "RTX-4090"


def test_json_unknown_key_is_named(tmp_path: Path) -> None:
    data = HardwareProfile.from_name("L4").to_dict()
    data["colour"] = "red"
    (tmp_path / "hw.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="'colour'"):
        HardwareProfile.load(tmp_path / "hw.json")
    data = HardwareProfile.from_name("L4").to_dict()
    data["gpus"][0]["vram"] = 1
    with pytest.raises(ConfigError, match=r"gpus\[0\].*'vram'"):
        HardwareProfile.from_dict(data)


def test_json_margin_out_of_range_is_rejected() -> None:
    data = HardwareProfile.from_name("L4").to_dict()
    data["safety_margin"] = 0.99
    with pytest.raises(ConfigError, match="0.98"):
        HardwareProfile.from_dict(data)


def test_summary_rows() -> None:
    rows = HardwareProfile.from_name("L4").summary_rows()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in rows)
    table = dict(rows)
    assert table["Memory per GPU"] == "22.50 GiB"
    assert "300 GB/s" in table["Memory bandwidth"]
    assert "datasheet" in table["Figures from"]


# ------------------------------------------------------------------ detection


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_detect_without_cuda_is_cpu_only() -> None:
    profile = HardwareProfile.detect()
    assert profile.source == "cpu-only" and profile.gpus == [] and profile.num_gpus == 0
    assert 0 < profile.host_total_bytes <= _meminfo_total_bytes()
    assert 0 < profile.host_available_bytes <= profile.host_total_bytes
    assert profile.cpu_count >= 1
    assert profile.usable_bytes <= profile.host_available_bytes
    assert profile.peak_tflops("fp32") is None and not profile.supports_bf16
    assert HardwareProfile.resolve("AUTO").source == "cpu-only"
    assert dict(profile.summary_rows())["Source"] == "cpu-only"


def _fake_cuda(
    monkeypatch: pytest.MonkeyPatch, name: str, total: int, free: int, own: int | None = None
) -> None:
    props = SimpleNamespace(name=name, major=8, minor=6, uuid=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: 0)
    monkeypatch.setattr(probe, "_own_process_gpu_bytes", lambda props: own)


def test_detect_reports_memory_held_by_others(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA A10G", total=24 * GiB, free=20 * GiB)
    with pytest.warns(UserWarning, match=r"3\.50 GiB of 24\.00 GiB is held by other processes"):
        profile = HardwareProfile.detect(safety_margin=0.85)
    # 4 GiB in use, of which 512 MiB is assumed to be this process's own CUDA context.
    assert profile.gpus[0].used_by_others_bytes == 4 * GiB - 512 * MiB
    assert profile.source == "detected" and profile.spec.name == "A10G"
    assert profile.gpus[0].compute_capability == "8.6" and profile.supports_bf16
    assert profile.gpu_memory_bytes == 24 * GiB
    assert profile.usable_bytes == round(20.5 * GiB * 0.85)
    assert any("held by other processes" in note for note in profile.notes)
    assert HardwareProfile.from_json(profile.to_json()) == profile


def test_detect_uses_nvml_own_usage_when_known(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA A10G", total=24 * GiB, free=18 * GiB, own=2 * GiB)
    with pytest.warns(UserWarning):
        profile = HardwareProfile.detect()
    assert profile.gpus[0].used_by_others_bytes == 4 * GiB  # 24 - 18 - 2


def test_detect_own_context_alone_does_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA A10G", total=24 * GiB, free=24 * GiB - 300 * MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = HardwareProfile.detect()
    assert profile.gpus[0].used_by_others_bytes == 0 and profile.notes == []


def test_detect_unknown_or_mismatched_gpu_has_no_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA Mystery 9000", total=40 * GiB, free=40 * GiB)
    profile = HardwareProfile.detect()
    assert profile.spec is None and profile.peak_tflops("bf16") is None
    assert profile.memory_bandwidth_bytes_per_second is None
    assert profile.usable_bytes == round(40 * GiB * 0.85)
    # Same name as the 16 GB catalog entry, but an 8 GB card: not matched.
    _fake_cuda(monkeypatch, "NVIDIA GeForce RTX 4060 Ti", total=8 * GiB, free=8 * GiB)
    assert HardwareProfile.detect().spec is None


def test_detect_num_gpus_beyond_visible_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch, "NVIDIA L4", total=22 * GiB + 512 * MiB, free=22 * GiB)
    assert HardwareProfile.resolve("auto", num_gpus=1).spec.name == "L4"
    with pytest.raises(ConfigError, match="shows 1 CUDA device"):
        HardwareProfile.resolve("auto", num_gpus=2)


def test_resolve_name() -> None:
    profile = HardwareProfile.resolve("l4", num_gpus=2)
    assert profile.source == "catalog" and profile.num_gpus == 2


# ------------------------------------------------------------------ host memory


def test_host_memory_capped_by_cgroup(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text(f"{2 * GiB}\n")
    (tmp_path / "memory.current").write_text(f"{3 * GiB // 2}\n")
    (tmp_path / "memory.stat").write_text(f"anon 1\ninactive_file {GiB // 2}\n")
    total, available = host_memory_bytes(tmp_path)
    assert total == 2 * GiB  # this test machine has more than 2 GiB of RAM
    assert available == 1 * GiB  # 2 GiB limit - (1.5 GiB used - 0.5 GiB reclaimable cache)


def test_host_memory_without_cgroup_limit(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("max\n")
    total, available = host_memory_bytes(tmp_path)
    assert total == _meminfo_total_bytes() and 0 < available <= total


def test_host_memory_without_psutil_reads_proc_meminfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    total, available = host_memory_bytes(tmp_path)  # empty folder: no cgroup limit
    assert total == _meminfo_total_bytes() and 0 < available <= total
