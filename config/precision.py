"""Mixed-precision presets, named as in NeMo so that users recognise them.

A preset is chosen by name (`precision=bf16_with_fp8_current_scaling_mixed`). The FP8 variants run
their GEMMs through Transformer Engine with the named scaling recipe; gradients and the optimizer
stay in BF16/FP32 as in the plain mixed preset. Delayed, current scaling and MXFP8 keep the
decoder's weights in FP8 alone where the distributed optimizer all-gathers them
(`fp8_param_gather`, as both NeMo's and Megatron-Bridge's presets of those names set it:
config/backend.py `fp8_weights`); subchannel scaling and NVFP4 keep BF16 weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Each params_dtype's torch dtype by its attribute name (this package does not import torch):
# getattr(torch, TORCH_DTYPES[preset.params_dtype]).
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True, slots=True)
class PrecisionPreset:
    name: str
    params_dtype: str  # "bf16", "fp16" or "fp32": the dtype of weights and activations
    # None, or Transformer Engine's scaling recipe: "delayed", "tensorwise" (current scaling),
    # "blockwise" (1x128 activations / 128x128 weights), "mxfp8" (32-element blocks) or "nvfp4".
    fp8_recipe: str | None = None
    # "hybrid": E4M3 forward, E5M2 gradients; "e4m3" everywhere (what MXFP8 uses).
    fp8_format: str | None = None
    # Current scaling keeps the first and last transformer layers in BF16: they see the widest
    # activation ranges and cost the least of the whole stack.
    first_last_layers_bf16: bool = False
    fp8_amax_history_len: int = 1
    loss_scale: str | None = None  # "dynamic" for FP16: gradients underflow without it
    fp8_param_gather: bool = False  # FP8 weights, no BF16 copy (module docstring)

    @property
    def needs(self) -> str | None:
        """The tensor-core feature this preset needs: None, "fp8", "fp8_blockwise", "mxfp8", "fp4"."""
        return {
            None: None,
            "delayed": "fp8",
            "tensorwise": "fp8",
            "blockwise": "fp8_blockwise",
            "mxfp8": "mxfp8",
            "nvfp4": "fp4",
        }[self.fp8_recipe]


def _presets() -> dict[str, PrecisionPreset]:
    out: dict[str, PrecisionPreset] = {}
    for dtype in ("bf16", "fp16"):
        scale = "dynamic" if dtype == "fp16" else None
        variants = [
            PrecisionPreset(name=f"{dtype}_mixed", params_dtype=dtype),
            PrecisionPreset(
                name=f"{dtype}_with_fp8_delayed_scaling_mixed",
                params_dtype=dtype,
                fp8_recipe="delayed",
                fp8_format="hybrid",
                fp8_amax_history_len=1024,
                fp8_param_gather=True,
            ),
            PrecisionPreset(
                name=f"{dtype}_with_fp8_current_scaling_mixed",
                params_dtype=dtype,
                fp8_recipe="tensorwise",
                fp8_format="hybrid",
                first_last_layers_bf16=True,
                fp8_param_gather=True,
            ),
            PrecisionPreset(
                name=f"{dtype}_with_fp8_subchannel_scaling_mixed",
                params_dtype=dtype,
                fp8_recipe="blockwise",
                fp8_format="e4m3",
            ),
            PrecisionPreset(
                name=f"{dtype}_with_mxfp8_mixed",
                params_dtype=dtype,
                fp8_recipe="mxfp8",
                fp8_format="e4m3",
                fp8_param_gather=True,
            ),
            PrecisionPreset(
                name=f"{dtype}_with_nvfp4_mixed", params_dtype=dtype, fp8_recipe="nvfp4"
            ),
        ]
        for preset in variants:
            out[preset.name] = dataclasses.replace(preset, loss_scale=scale)
    # FP32 throughout: for exact comparisons (the Hugging Face oracle tests) and CPU checks, not
    # for speed on GPUs.
    out["fp32"] = PrecisionPreset(name="fp32", params_dtype="fp32")
    # NeMo's older name for delayed scaling.
    out["bf16_with_fp8_mixed"] = out["bf16_with_fp8_delayed_scaling_mixed"]
    out["fp16_with_fp8_mixed"] = out["fp16_with_fp8_delayed_scaling_mixed"]
    return out


PRESETS: dict[str, PrecisionPreset] = _presets()


def gpu_runs(gpu_spec, preset: PrecisionPreset) -> bool:
    """Whether a GPU (config.hardware.GpuSpec) has the tensor cores the preset needs."""
    need = preset.needs
    if need is None:
        return True
    if need == "fp8":
        return gpu_spec.fp8_tflops is not None
    if need == "fp8_blockwise":
        return gpu_spec.fp8_blockwise
    if need == "mxfp8":
        return gpu_spec.mxfp8
    return gpu_spec.fp4_tflops is not None
